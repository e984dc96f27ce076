"""A stand-in for mamba2_ssd in the CPU tests of bench.py: the float64 reference rounded to the
input dtype. Fails on purpose for seqlen 40 (the bench must record that and go on)."""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ref_f64  # noqa: E402

__version__ = "fake-0"


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                              return_final_states=False, return_varlen_states=False, *, state_dtype=None,
                              out=None):
    if x.shape[1] == 40:
        raise RuntimeError("fake_ours: planted failure for seqlen 40")
    o, f = ref_f64.chunked_f64(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                               initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit)
    o = o.to(x.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, f.float()) if return_final_states else o
