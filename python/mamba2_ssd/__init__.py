"""Mamba-2 SSD forward kernels for Hopper GPUs.

PyTorch (imported on first use, so that the package works without torch):

    from mamba2_ssd import mamba_chunk_scan_combined   # drop-in for mamba_ssm's function
    from mamba2_ssd import mamba_chunk_scan_varlen     # batch-less serving layout

Any DLPack-capable arrays (numpy, CuPy, JAX, torch), caller-provided outputs:

    mamba2_ssd.forward_dlpack(x=..., dt=..., A=..., B=..., C=..., chunk_size=..., out=...)

CPU tensors/arrays run the float64 CPU reference; CUDA ones run the kernels.
Errors: InvalidArgumentError (a ValueError), UnsupportedError (a NotImplementedError),
CudaError (a RuntimeError), each with the C++ message and `.argument`; TypeError for a
wrong Python type.
"""
from ._C import (
    WITH_CUDA,
    CudaError,
    InvalidArgumentError,
    UnsupportedError,
    cuda_available,
    max_varlen_chunks,
    reset_tuning_cache,
    tuning_cache_path,
)
from ._C import version as _version
from ._dlpack import forward_dlpack, workspace_size_dlpack

__version__ = _version()

# Names served by the PyTorch module, imported lazily (importing torch takes seconds).
_TORCH_NAMES = frozenset(
    {
        "mamba_chunk_scan_combined",
        "mamba_chunk_scan_varlen",
        "chunk_scan_fwd",
        "chunk_scan_fwd_out",
    }
)

__all__ = [
    "__version__",
    "WITH_CUDA",
    "CudaError",
    "InvalidArgumentError",
    "UnsupportedError",
    "cuda_available",
    "max_varlen_chunks",
    "tune",
    "tuning_cache_path",
    "reset_tuning_cache",
    "forward_dlpack",
    "workspace_size_dlpack",
    *sorted(_TORCH_NAMES),
]


def tune(*args, budget_seconds=10.0, repeats=5, store=True, **kwargs):
    """Tune the GPU kernel settings for one call's shape class and cache the fastest.

    Takes exactly the arguments of ``mamba_chunk_scan_combined`` (CUDA tensors), runs the call
    once with every kernel setting timed first (the call's outputs are computed as usual and
    discarded), stores the fastest setting in the tuning cache (``tuning_cache_path()``; set
    ``store=False`` to keep it out), and returns a dict: ``key`` (the shape class), ``best`` and
    ``heuristic`` (settings), ``best_ms`` / ``heuristic_ms`` (GPU time of a whole forward call),
    ``measured`` (kernel, setting, ms) tuples, ``complete`` (False when ``budget_seconds`` ran out
    before every candidate) and ``seconds``. Synchronizes the current stream; not for use inside
    CUDA graph capture. Later calls of that shape class use the cached setting.
    """
    from . import _C
    from . import torch_ops

    _C._tune_next_call(float(budget_seconds), int(repeats), bool(store))
    try:
        torch_ops.mamba_chunk_scan_combined(*args, **kwargs)
    finally:
        _C._cancel_tune()
    result = _C._last_tune_result()
    if not result["key"]:
        raise UnsupportedError("tune(): the call did not reach the GPU kernels (CPU tensors?)")
    return result


def __getattr__(name):
    if name in _TORCH_NAMES:
        try:
            from . import torch_ops
        except ImportError as e:  # torch missing
            raise ImportError(
                f"mamba2_ssd.{name} needs PyTorch (>= 2.4), which could not be imported ({e}); "
                "without torch, use mamba2_ssd.forward_dlpack"
            ) from e
        return getattr(torch_ops, name)
    raise AttributeError(f"module 'mamba2_ssd' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | _TORCH_NAMES)
