"""PyTorch integration: the operators and the public drop-in functions.

Operators (torch.library, each with a fake implementation, so torch.compile with
fullgraph=True, CUDA graph capture and torch.library.opcheck work):

  torch.ops.mamba2_ssd.chunk_scan_fwd(x, dt, A, B, C, chunk_size, D, z, dt_bias,
      initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max, varlen,
      want_final_states, want_varlen_states, want_chunk_states, state_dtype) -> Tensor[]
    Functional. Returns [out] followed by the outputs asked for, in this order:
    final_states (float32), varlen_states (batched layout only), chunk_states and, in the
    varlen layout, chunk_offsets.

  torch.ops.mamba2_ssd.chunk_scan_fwd_out(<the 16 inputs and scalars up to varlen>,
      state_dtype, out, final_states, varlen_states, chunk_states, chunk_offsets) -> ()
    Writes the caller's outputs in place (out required, the others optional).

Inside the operators, inputs that mamba_ssm accepts but the kernels do not take directly are
converted (binding.cpp, forward_torch): A, D, dt_bias of a 16-bit dtype are upcast to float32,
an int64 seq_idx is narrowed to int32, and x, B, C, z, initial_states or D (h, p) views with a
non-contiguous last dimension (or, on the GPU, not 16-byte aligned) are copied. Nothing else
is copied; outputs are never replaced.

The operators are registered with Python kernels for the CPU and CUDA dispatch keys (the
cheapest way through the dispatcher) and have no autograd formula: the public functions
below refuse inputs that require grad while grad mode is on (see NO_BACKWARD_MESSAGE).
"""
import math
import os
from typing import List, Optional

import torch
from torch import Tensor

from . import _C
from ._dlpack import invalid_argument

__all__ = [
    "mamba_chunk_scan_combined",
    "mamba_chunk_scan_varlen",
    "chunk_scan_fwd",
    "chunk_scan_fwd_out",
    "NO_BACKWARD_MESSAGE",
    "set_eager_fast_path",
]

NO_BACKWARD_MESSAGE = (
    "mamba2_ssd: the backward pass is not implemented yet (forward only). Call it under "
    "torch.no_grad() or torch.inference_mode(), or pass inputs that do not require grad."
)

_DTYPE_CODE = {
    torch.float32: _C.DTYPE_FLOAT32,
    torch.float16: _C.DTYPE_FLOAT16,
    torch.bfloat16: _C.DTYPE_BFLOAT16,
}


def _alloc_workspace(nbytes: int, like: Tensor) -> Tensor:
    # Called from C++ for CUDA calls that need scratch memory: the caching allocator makes this
    # cheap, and it is legal inside CUDA graph capture (the graph's private pool).
    return like.new_empty((nbytes,), dtype=torch.uint8)


def _convert(t: Tensor, kind: int) -> Tensor:
    # Called from C++ (forward_torch) for the inputs mamba_ssm accepts but the kernels do not take
    # directly; see binding.cpp. 0: a contiguous copy (a fresh allocation is 512-byte aligned),
    # 1: float32 (A, D, dt_bias of a 16-bit model), 2: int32 (an int64 seq_idx).
    if kind == 1:
        return t.float()
    if kind == 2:
        return t.to(torch.int32)
    return t.clone(memory_format=torch.contiguous_format)


# Order: the mamba2_ssd::DType values (float32, float16, bfloat16, int32, int64).
_C._register_torch(
    torch.Tensor,
    (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64),
    _alloc_workspace,
    _convert,
)

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _state_code(state_dtype: Optional[torch.dtype]) -> int:
    if state_dtype is None:
        return -1
    code = _DTYPE_CODE.get(state_dtype)
    if code is None:
        raise invalid_argument(
            "state_dtype", f"expected None, torch.float32 or a 16-bit float dtype, got {state_dtype}"
        )
    return code


# ---------------------------------------------------------------- output allocation


def _output_dims(x: Tensor, B: Tensor, cu_seqlens: Optional[Tensor], chunk_size: int, varlen: bool):
    """(states_lead, h, p, n, chunk_states_lead, nseq) or None when the ranks do not fit (the
    C++ validation then reports the problem)."""
    if chunk_size < 1:
        return None
    nseq = None
    if cu_seqlens is not None:
        # A cu_seqlens of the wrong rank gets outputs with 0 sequences: validation reports it.
        nseq = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else 0
    if varlen:
        if x.dim() != 3 or B.dim() != 3 or nseq is None:
            return None
        T, h, p = x.shape
        # max_varlen_chunks(T, S, Q) = S + floor((T - S) / Q), in Python arithmetic so that it
        # also works on symbolic sizes.
        capacity = nseq + (T - nseq) // chunk_size
        return nseq, h, p, B.shape[2], (capacity,), nseq
    if x.dim() != 4 or B.dim() != 4:
        return None
    b, l, h, p = x.shape
    return b, h, p, B.shape[3], (b, (l + chunk_size - 1) // chunk_size), nseq


def _alloc_outputs(x, B, C, cu_seqlens, chunk_size, varlen, want_final, want_varlen, want_chunk, state_dtype):
    """(final_states, varlen_states, chunk_states, chunk_offsets), None where not asked for
    (or where it does not apply to the layout)."""
    if not (want_final or want_varlen or want_chunk):
        return None, None, None, None
    dims = _output_dims(x, B, cu_seqlens, chunk_size, varlen)
    if dims is None:
        return None, None, None, None
    lead, h, p, n, chunk_lead, nseq = dims
    sdt = C.dtype if state_dtype is None else state_dtype
    final = x.new_empty((lead, h, p, n), dtype=torch.float32) if want_final else None
    vstates = None
    if want_varlen and not varlen and nseq is not None:
        vstates = x.new_empty((nseq, h, p, n), dtype=sdt)
    cstates = offsets = None
    if want_chunk:
        if varlen:
            # Only chunk_offsets[S] <= capacity entries get written (a count known on the device
            # only); the rest is zeroed so that results are deterministic.
            cstates = x.new_zeros((*chunk_lead, h, p, n), dtype=sdt)
            offsets = x.new_empty((nseq + 1,), dtype=torch.int32)
        else:
            cstates = x.new_empty((*chunk_lead, h, p, n), dtype=sdt)
    return final, vstates, cstates, offsets


def _launch(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final, vstates, cstates, offsets):  # fmt: skip
    if x.is_cuda:
        index = x.get_device()
        stream = _current_stream(index)
    else:
        index, stream = -1, 0
    _C.forward_torch(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, dt_min, dt_max, varlen, _state_code(state_dtype),
        out, final, vstates, cstates, offsets, stream, index,
    )  # fmt: skip


def _fake_check(x: Tensor, B: Tensor, cu_seqlens: Optional[Tensor], chunk_size: int, varlen: bool):
    # The real kernel raises the C++ validation message; while tracing, only the ranks matter.
    if _output_dims(x, B, cu_seqlens, chunk_size, varlen) is None:
        layout = "varlen" if varlen else "batched"
        raise invalid_argument(
            "x",
            f"shapes do not fit the {layout} layout (x rank {x.dim()}, B rank {B.dim()}, "
            f"chunk_size {chunk_size}, cu_seqlens {'given' if cu_seqlens is not None else 'absent'})",
        )


# ---------------------------------------------------------------- operators

_lib = torch.library.Library("mamba2_ssd", "FRAGMENT")

_INPUTS_SCHEMA = (
    "Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D, Tensor? z, "
    "Tensor? dt_bias, Tensor? initial_states, Tensor? seq_idx, Tensor? cu_seqlens, bool dt_softplus, "
    "float dt_min, float dt_max, bool varlen"
)
_lib.define(
    f"chunk_scan_fwd({_INPUTS_SCHEMA}, bool want_final_states, bool want_varlen_states, "
    "bool want_chunk_states, ScalarType? state_dtype) -> Tensor[]"
)
_lib.define(
    f"chunk_scan_fwd_out({_INPUTS_SCHEMA}, ScalarType? state_dtype, Tensor(a!) out, "
    "Tensor(b!)? final_states, Tensor(c!)? varlen_states, Tensor(d!)? chunk_states, "
    "Tensor(e!)? chunk_offsets) -> ()"
)


def _returned(out, final, vstates, cstates, offsets) -> List[Tensor]:
    return [t for t in (out, final, vstates, cstates, offsets) if t is not None]


def chunk_scan_fwd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                   dt_softplus, dt_min, dt_max, varlen, want_final_states, want_varlen_states,
                   want_chunk_states, state_dtype) -> List[Tensor]:  # fmt: skip
    """Kernel of torch.ops.mamba2_ssd.chunk_scan_fwd (CPU and CUDA)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # (cheaper than new_empty)
    final, vstates, cstates, offsets = _alloc_outputs(x, B, C, cu_seqlens, chunk_size, varlen, want_final_states,
                                                      want_varlen_states, want_chunk_states, state_dtype)  # fmt: skip
    _launch(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final, vstates, cstates, offsets)  # fmt: skip
    return _returned(out, final, vstates, cstates, offsets)


def _chunk_scan_fwd_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                         dt_softplus, dt_min, dt_max, varlen, want_final_states, want_varlen_states,
                         want_chunk_states, state_dtype) -> List[Tensor]:  # fmt: skip
    _fake_check(x, B, cu_seqlens, chunk_size, varlen)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # (cheaper than new_empty)
    final, vstates, cstates, offsets = _alloc_outputs(x, B, C, cu_seqlens, chunk_size, varlen, want_final_states,
                                                      want_varlen_states, want_chunk_states, state_dtype)  # fmt: skip
    return _returned(out, final, vstates, cstates, offsets)


def chunk_scan_fwd_out(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                       dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final_states, varlen_states,
                       chunk_states, chunk_offsets) -> None:  # fmt: skip
    """Kernel of torch.ops.mamba2_ssd.chunk_scan_fwd_out (CPU and CUDA)."""
    _launch(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final_states, varlen_states,
            chunk_states, chunk_offsets)  # fmt: skip


def _chunk_scan_fwd_out_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                             dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final_states,
                             varlen_states, chunk_states, chunk_offsets) -> None:  # fmt: skip
    _fake_check(x, B, cu_seqlens, chunk_size, varlen)


for _key in ("CPU", "CUDA"):
    _lib.impl("chunk_scan_fwd", chunk_scan_fwd, _key)
    _lib.impl("chunk_scan_fwd_out", chunk_scan_fwd_out, _key)
torch.library.register_fake("mamba2_ssd::chunk_scan_fwd", _chunk_scan_fwd_fake, lib=_lib)
torch.library.register_fake("mamba2_ssd::chunk_scan_fwd_out", _chunk_scan_fwd_out_fake, lib=_lib)

_op = torch.ops.mamba2_ssd.chunk_scan_fwd.default
_op_out = torch.ops.mamba2_ssd.chunk_scan_fwd_out.default


# ---------------------------------------------------------------- argument normalisation

_INPUT_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


def _check_inputs(values, grad_enabled: bool) -> bool:
    """Type checks (TypeError) and the no-backward rule, in one pass over the inputs that could
    carry gradients. `values` follows _INPUT_NAMES; the first 5 are required. Returns whether
    all of them are plain tensors (no subclass)."""
    plain = True
    for i, t in enumerate(values):
        if t is None:
            if i < 5:
                raise TypeError(f"{_INPUT_NAMES[i]}: expected a torch.Tensor, got None")
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{_INPUT_NAMES[i]}: expected a torch.Tensor, got {type(t).__name__}")
        if grad_enabled and t.requires_grad:
            raise RuntimeError(NO_BACKWARD_MESSAGE)
        if type(t) not in _PLAIN_TYPES:
            plain = False
    return plain


def _check_optional_tensor(name: str, t) -> bool:
    """TypeError unless None or a tensor; returns whether it is None or a plain tensor."""
    if t is None:
        return True
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
    return type(t) in _PLAIN_TYPES


def _scalars(chunk_size, dt_softplus, dt_limit, state_dtype):
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, torch.SymInt)):
        raise TypeError(f"chunk_size: expected an int, got {type(chunk_size).__name__}")
    try:
        dt_min, dt_max = dt_limit
        dt_min, dt_max = float(dt_min), float(dt_max)
    except (TypeError, ValueError):
        raise TypeError(f"dt_limit: expected a pair of floats (min, max), got {dt_limit!r}") from None
    if state_dtype is not None:
        if not isinstance(state_dtype, torch.dtype):
            raise TypeError(f"state_dtype: expected a torch.dtype or None, got {type(state_dtype).__name__}")
        _state_code(state_dtype)
    return bool(dt_softplus), dt_min, dt_max


# ---------------------------------------------------------------- eager fast path
#
# A call made in plain eager mode -- not traced or compiled, no dispatch or torch-function mode,
# no functorch transform, no profiler recording, only plain CPU/CUDA tensors -- calls the
# operator's kernel directly, skipping the dispatcher's per-call cost (about 7 us of a 45 us call
# on the H200 machine, 2026-11-30). The results are the same. Everything else goes through the
# operators (torch.ops.mamba2_ssd.*), and so do all calls with MAMBA2_SSD_EAGER_FAST_PATH=0 in
# the environment (or after set_eager_fast_path(False)).

_fast_path = os.environ.get("MAMBA2_SSD_EAGER_FAST_PATH", "1") != "0"

try:
    _is_compiling = torch.compiler.is_compiling
    _jit_is_tracing = torch.jit.is_tracing
    _dispatch_stack_len = torch._C._len_torch_dispatch_stack
    _torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled
    _functorch_stack = torch._C._functorch.peek_interpreter_stack
    _profiler_enabled = torch._C._autograd._profiler_enabled
except AttributeError:  # an older torch: no fast path
    _fast_path_supported = False
else:
    _fast_path_supported = True


def set_eager_fast_path(enabled: bool) -> bool:
    """Enables or disables the eager fast path (see above); returns the previous setting."""
    global _fast_path
    previous = _fast_path
    _fast_path = bool(enabled)
    return previous


def _eager(plain: bool, x: Tensor) -> bool:
    return (
        _fast_path
        and plain
        and _fast_path_supported
        and not _is_compiling()
        and not _jit_is_tracing()
        and _dispatch_stack_len() == 0
        and not _torch_function_mode_enabled()
        and _functorch_stack() is None
        and not _profiler_enabled()
        and (x.is_cuda or x.is_cpu)
    )


# ---------------------------------------------------------------- public functions


def mamba_chunk_scan_combined(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    cu_seqlens=None,
    dt_softplus=False,
    dt_limit=(0.0, float("inf")),
    return_final_states=False,
    return_varlen_states=False,
    *,
    state_dtype=None,
    out=None,
):
    """Drop-in for mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined (2.3.2.post1),
    forward only.

    Argument:
        x: (batch, seqlen, nheads, headdim)
        dt: (batch, seqlen, nheads)
        A: (nheads)
        B: (batch, seqlen, ngroups, dstate)
        C: (batch, seqlen, ngroups, dstate)
        chunk_size: int (the GPU runs 64, 128 and 256)
        D: (nheads, headdim) or (nheads,)
        z: (batch, seqlen, nheads, headdim)
        dt_bias: (nheads,)
        initial_states: (batch, nheads, headdim, dstate)
        seq_idx: (batch, seqlen) int32 (int64 is converted)
        cu_seqlens: (num_sequences + 1) or None, only used if return_varlen_states is True
        dt_softplus: Whether to apply softplus to dt
        dt_limit: (min, max) clamp of dt
        state_dtype (keyword): dtype of the chunk states and of varlen_states: None (the dtype
            of C, as mamba_ssm), torch.float32, or the 16-bit compute dtype
        out (keyword): a tensor like x to write the output into (returned as `out`)
    Return:
        out; (out, final_states); (out, varlen_states); or (out, final_states, varlen_states)
        as mamba_ssm: final_states (batch, nheads, headdim, dstate) float32, varlen_states
        (num_sequences, nheads, headdim, dstate) in state_dtype.

    Runs on the current CUDA stream for CUDA tensors; CPU tensors run the float64 CPU reference.
    A, D and dt_bias of another dtype are upcast to float32; inputs whose last dimension is not
    contiguous are copied; nothing else is copied.
    """
    if not return_varlen_states:
        cu_seqlens = None
    elif cu_seqlens is None:
        raise invalid_argument("cu_seqlens", "must be provided if return_varlen_states is True")
    plain = _check_inputs((x, dt, A, B, C, D, z, dt_bias, initial_states), torch.is_grad_enabled())
    plain = _check_optional_tensor("seq_idx", seq_idx) and plain
    plain = _check_optional_tensor("cu_seqlens", cu_seqlens) and plain
    plain = _check_optional_tensor("out", out) and plain
    dt_softplus, dt_min, dt_max = _scalars(chunk_size, dt_softplus, dt_limit, state_dtype)
    want_final = bool(return_final_states)
    want_varlen = bool(return_varlen_states)

    eager = _eager(plain, x)
    if out is None:
        res = (chunk_scan_fwd if eager else _op)(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_min, dt_max, False, want_final, want_varlen, False, state_dtype,
        )  # fmt: skip
        if len(res) == 1:
            return res[0]
        return tuple(res)  # (out, final_states), (out, varlen_states) or all three
    final_states, varlen_states, _, _ = _alloc_outputs(x, B, C, cu_seqlens, chunk_size, False, want_final,
                                                       want_varlen, False, state_dtype)  # fmt: skip
    (chunk_scan_fwd_out if eager else _op_out)(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, dt_min, dt_max, False, state_dtype, out, final_states, varlen_states, None, None,
    )  # fmt: skip
    if not want_varlen:
        return (out, final_states) if want_final else out
    return (out, final_states, varlen_states) if want_final else (out, varlen_states)


def mamba_chunk_scan_varlen(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    *,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    return_chunk_states=False,
    state_dtype=None,
    out=None,
):
    """The serving (batch-less) layout: sequence i owns tokens [cu_seqlens[i], cu_seqlens[i+1])
    of x (T, nheads, headdim), dt (T, nheads), B/C (T, ngroups, dstate), z like x; cu_seqlens
    (S + 1) int32 or int64. Every sequence starts on a fresh chunk, from initial_states[i]
    (S, nheads, headdim, dstate) or zero; D, dt_bias, dt_softplus and dt_limit as in
    mamba_chunk_scan_combined.

    Returns (out, final_states) with final_states (S, nheads, headdim, dstate) float32, or with
    return_chunk_states (out, final_states, chunk_states, chunk_offsets): chunk_states
    (max_varlen_chunks(T, S, chunk_size), nheads, headdim, dstate) in state_dtype (None: the dtype
    of C) and chunk_offsets (S + 1) int32: sequence i's chunk j is chunk_states[chunk_offsets[i] + j],
    chunk_offsets[S] chunks are used (the rest of the capacity is zero).

    On CUDA, cu_seqlens is not read on the host: it must start at 0, be non-decreasing and end
    at T (checked only for CPU tensors).
    """
    if cu_seqlens is None:
        raise TypeError("cu_seqlens: expected a torch.Tensor, got None")
    plain = _check_inputs((x, dt, A, B, C, D, z, dt_bias, initial_states), torch.is_grad_enabled())
    plain = _check_optional_tensor("cu_seqlens", cu_seqlens) and plain
    plain = _check_optional_tensor("out", out) and plain
    dt_softplus, dt_min, dt_max = _scalars(chunk_size, dt_softplus, dt_limit, state_dtype)
    want_chunk = bool(return_chunk_states)

    eager = _eager(plain, x)
    if out is None:
        return tuple(
            (chunk_scan_fwd if eager else _op)(
                x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, None, cu_seqlens,
                dt_softplus, dt_min, dt_max, True, True, False, want_chunk, state_dtype,
            )
        )  # fmt: skip
    final_states, _, chunk_states, chunk_offsets = _alloc_outputs(x, B, C, cu_seqlens, chunk_size, True, True,
                                                                  False, want_chunk, state_dtype)  # fmt: skip
    (chunk_scan_fwd_out if eager else _op_out)(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, None, cu_seqlens,
        dt_softplus, dt_min, dt_max, True, state_dtype, out, final_states, None, chunk_states, chunk_offsets,
    )  # fmt: skip
    if want_chunk:
        return out, final_states, chunk_states, chunk_offsets
    return out, final_states
