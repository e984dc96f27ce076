"""The framework-neutral entry: DLPack-capable arrays in, caller-provided outputs written.

Needs neither torch nor numpy. Works with anything nanobind imports as an ndarray: objects
with __dlpack__ (numpy >= 1.22, CuPy, JAX, torch, ...) or the buffer protocol.
"""
from __future__ import annotations

import math

from . import _C

__all__ = ["forward_dlpack", "workspace_size_dlpack"]


def invalid_argument(argument: str, what: str) -> Exception:
    """An InvalidArgumentError (a ValueError) worded like the C++ validation messages."""
    e = _C.InvalidArgumentError(f"{argument}: {what}")
    e.argument = argument
    return e

_STATE_DTYPE_CODES = {
    "float32": _C.DTYPE_FLOAT32,
    "float16": _C.DTYPE_FLOAT16,
    "bfloat16": _C.DTYPE_BFLOAT16,
}


def _state_dtype_code(state_dtype) -> int:
    """None -> -1 (the dtype of C); else float32/float16/bfloat16 given as a string, a numpy,
    CuPy or JAX dtype (anything with .name) or a torch dtype."""
    if state_dtype is None:
        return -1
    if isinstance(state_dtype, str):
        name = state_dtype
    else:
        name = getattr(state_dtype, "name", None)
        if not isinstance(name, str):
            name = getattr(getattr(state_dtype, "dtype", None), "name", None)  # e.g. numpy scalar types
        if not isinstance(name, str):
            name = str(state_dtype)
    name = name.rsplit(".", 1)[-1]  # "torch.float32" -> "float32"
    code = _STATE_DTYPE_CODES.get(name)
    if code is None:
        try:  # numpy scalar types such as numpy.float32
            import numpy as np

            code = _STATE_DTYPE_CODES.get(np.dtype(state_dtype).name)
        except Exception:  # noqa: BLE001 - not a numpy dtype either
            code = None
    if code is None:
        raise invalid_argument("state_dtype", f"expected None, float32, bfloat16 or float16, got {state_dtype!r}")
    return code


def _layout_flag(layout) -> bool:
    if layout == "batched":
        return False
    if layout == "varlen":
        return True
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected 'batched' or 'varlen', got {type(layout).__name__}")
    raise invalid_argument("layout", f"expected 'batched' or 'varlen', got {layout!r}")


def _stream_handle(stream) -> int:
    """An int (cudaStream_t as an integer; 0 = the legacy default stream), or an object with
    .ptr (CuPy streams) or .cuda_stream (torch streams)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream: expected an int handle or a stream object, got bool")
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(
        f"stream: expected an int handle or an object with .ptr / .cuda_stream, got {type(stream).__name__}"
    )


def _scalars(chunk_size, dt_softplus, dt_limit):
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size: expected an int, got {type(chunk_size).__name__}")
    if not isinstance(dt_softplus, bool):
        raise TypeError(f"dt_softplus: expected a bool, got {type(dt_softplus).__name__}")
    try:
        dt_min, dt_max = dt_limit
        dt_min, dt_max = float(dt_min), float(dt_max)
    except (TypeError, ValueError):
        raise TypeError(f"dt_limit: expected a pair of floats (min, max), got {dt_limit!r}") from None
    return chunk_size, dt_softplus, dt_min, dt_max


def workspace_size_dlpack(
    *,
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    out,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    cu_seqlens=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    layout="batched",
    state_dtype=None,
    final_states=None,
    varlen_states=None,
    chunk_states=None,
    chunk_offsets=None,
) -> int:
    """Bytes of device scratch memory forward_dlpack needs for these arguments (0 on CPU).
    Validates every argument (raising as forward_dlpack does)."""
    chunk_size, dt_softplus, dt_min, dt_max = _scalars(chunk_size, dt_softplus, dt_limit)
    return _C.workspace_size_dlpack(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, dt_min, dt_max, _layout_flag(layout), _state_dtype_code(state_dtype),
        out, final_states, varlen_states, chunk_states, chunk_offsets,
    )  # fmt: skip


def forward_dlpack(
    *,
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    out,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    cu_seqlens=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    layout="batched",
    state_dtype=None,
    final_states=None,
    varlen_states=None,
    chunk_states=None,
    chunk_offsets=None,
    workspace=None,
    stream=0,
) -> None:
    """Runs one SSD forward on DLPack-capable arrays, writing the given outputs in place.

    Arguments are the C++ ForwardParams (include/mamba2_ssd/params.hpp), keyword-only:
      layout="batched": x (b, l, h, p), dt (b, l, h), B/C (b, l, g, n), seq_idx (b, l) int32,
        initial_states/final_states (b, h, p, n), chunk_states (b, ceil(l/Q), h, p, n),
        cu_seqlens (S+1) with varlen_states (S, h, p, n) (batch 1).
      layout="varlen": x (T, h, p), dt (T, h), B/C (T, g, n), cu_seqlens (S+1) required,
        initial_states/final_states (S, h, p, n), chunk_states (capacity >=
        max_varlen_chunks(T, S, Q), h, p, n), chunk_offsets (S+1) int32.
      A (h) fp32, D (h) or (h, p) fp32, dt_bias (h) fp32, z like x.
      out (like x) is required; every other output is optional and computed when given.
      state_dtype: None (the dtype of C), float32, or the 16-bit compute type.

    CPU arrays run the float64 CPU reference synchronously. CUDA arrays: the kernels are
    enqueued on `stream` (an int cudaStream_t, or a CuPy/torch stream object; 0 = legacy
    default stream) and the call returns without synchronising; the caller orders the
    producers of the inputs before `stream`. `workspace`: a CUDA byte array of at least
    workspace_size_dlpack(...) bytes, 256-byte aligned; when None, the binding allocates it
    with cudaMallocAsync on `stream` and frees it there after the launches.
    """
    chunk_size, dt_softplus, dt_min, dt_max = _scalars(chunk_size, dt_softplus, dt_limit)
    _C.forward_dlpack(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, dt_min, dt_max, _layout_flag(layout), _state_dtype_code(state_dtype),
        out, final_states, varlen_states, chunk_states, chunk_offsets, workspace,
        _stream_handle(stream),
    )  # fmt: skip
