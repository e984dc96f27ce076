"""Roofline floors: the fewest bytes and the useful matrix FLOPs of one forward call, and of each
kernel of the two implementations (pure Python: no torch needed).

Sizes: b batch, l seqlen, h heads, g groups, p headdim, n dstate, Q chunk, c = ceil(l / Q)
chunks per row, T = b * l tokens.

End-to-end bytes (each input read once, each output written once):
    x          T*h*p * es        dt        T*h * es_dt      B, C   2 * T*g*n * es
    z          T*h*p * es        (if given)
    D          h or h*p * 4      A, dt_bias  h * 4 each
    init       b*h*p*n * es_init (if given)
    out        T*h*p * es        final     b*h*p*n * es_final (if returned)

Useful FLOPs (multiply + add = 2), per row, with pairs(q) = q(q+1)/2 the causal (s <= t) pairs
of a chunk holding q tokens, summed over the row's chunks:
    CB = C B^T, causal half, once per group:      2 * n * pairs(q) * g
    S.X (masked, decayed CB times dt' x):         2 * p * pairs(q) * h
    C.H^T (inter-chunk output):                   2 * n * p * q * h   (chunks k >= 1; chunk 0 too
                                                                       when initial states are given)
    X^T.B (the chunk's state contribution):       2 * p * n * q * h   (all chunks but the row's
                                                                       last; that one too when the
                                                                       final states are returned)
`flops_dense` is what the baseline of docs (DESIGN.md §3) counted: full Q x Q products for CB
and S.X and all four products on every (padded) chunk:
    c * (2 Q^2 n g + 2 Q^2 p h + 4 Q n p h) per row.

floor_ms = max(bytes / copy_bandwidth, flops / bf16_gemm_rate), both ceilings measured in the
same run (copy: bytes read + written by a large device copy; GEMM: bf16 8192^3 matmul).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict


@dataclass(frozen=True)
class Problem:
    b: int
    l: int
    h: int
    g: int
    p: int
    n: int
    q: int
    es: int = 2            # element size of x, B, C, z, out
    es_dt: int = 2         # element size of dt
    has_z: bool = False
    D: str = "head"        # "none" | "head" | "headdim"
    has_bias: bool = False
    es_init: int = 0       # 0: no initial states
    es_final: int = 0      # 0: final states not returned

    @property
    def nchunks(self) -> int:
        return (self.l + self.q - 1) // self.q

    @property
    def tokens(self) -> int:
        return self.b * self.l

    def as_dict(self):
        return asdict(self)


def _pairs(q: int) -> int:
    return q * (q + 1) // 2


def _chunk_lengths(l: int, q: int):
    """(count of full chunks, length of the last partial chunk or 0)."""
    return l // q, l % q


def io_bytes(pr: Problem) -> int:
    T = pr.tokens
    by = T * pr.h * pr.p * pr.es            # x
    by += T * pr.h * pr.es_dt                # dt
    by += 2 * T * pr.g * pr.n * pr.es        # B, C
    if pr.has_z:
        by += T * pr.h * pr.p * pr.es
    if pr.D == "head":
        by += pr.h * 4
    elif pr.D == "headdim":
        by += pr.h * pr.p * 4
    by += pr.h * 4                           # A
    if pr.has_bias:
        by += pr.h * 4
    if pr.es_init:
        by += pr.b * pr.h * pr.p * pr.n * pr.es_init
    by += T * pr.h * pr.p * pr.es            # out
    if pr.es_final:
        by += pr.b * pr.h * pr.p * pr.n * pr.es_final
    return by


def flop_terms(pr: Problem) -> dict:
    """The four useful matrix-product terms for the whole call (see module docstring)."""
    full, rem = _chunk_lengths(pr.l, pr.q)
    lens = [pr.q] * full + ([rem] if rem else [])
    pairs = sum(_pairs(q) for q in lens)
    ch_tokens = sum(lens[1:]) + (lens[0] if pr.es_init and lens else 0)
    st_tokens = sum(lens[:-1]) + (lens[-1] if pr.es_final and lens else 0)
    return {
        "cb": pr.b * 2 * pr.n * pairs * pr.g,
        "sx": pr.b * 2 * pr.p * pairs * pr.h,
        "ch": pr.b * 2 * pr.n * pr.p * ch_tokens * pr.h,
        "state": pr.b * 2 * pr.p * pr.n * st_tokens * pr.h,
    }


def useful_flops(pr: Problem) -> int:
    return sum(flop_terms(pr).values())


def dense_flops(pr: Problem) -> int:
    Q = pr.q
    per_chunk = 2 * Q * Q * pr.n * pr.g + 2 * Q * Q * pr.p * pr.h + 4 * Q * pr.n * pr.p * pr.h
    return pr.b * pr.nchunks * per_chunk


def floor_ms(nbytes: float, flops: float, copy_gbps: float, gemm_tflops: float) -> dict:
    """Times in ms from bytes at copy_gbps (GB/s, read+write counted) and flops at gemm_tflops."""
    b_ms = nbytes / (copy_gbps * 1e9) * 1e3 if copy_gbps > 0 else float("nan")
    f_ms = flops / (gemm_tflops * 1e12) * 1e3 if gemm_tflops > 0 else float("nan")
    vals = [v for v in (b_ms, f_ms) if not math.isnan(v)]
    return {
        "bytes": int(nbytes),
        "flops": int(flops),
        "bytes_ms": b_ms,
        "flops_ms": f_ms,
        "floor_ms": max(vals) if vals else float("nan"),
        "bound": "memory" if b_ms >= f_ms else "compute",
    }


def problem_floor(pr: Problem, copy_gbps: float, gemm_tflops: float) -> dict:
    d = floor_ms(io_bytes(pr), useful_flops(pr), copy_gbps, gemm_tflops)
    d["flops_dense"] = dense_flops(pr)
    d["flop_terms"] = flop_terms(pr)
    return d


# ---------------------------------------------------------------- per-kernel floors
# Each kernel's own traffic: what it must read and write given the intermediates the design
# stores between kernels (sizes as allocated: chunk-padded where the layout is per chunk).

def _common(pr: Problem):
    T = pr.tokens
    c = pr.nchunks
    cq = pr.b * pr.h * c * pr.q          # one fp32 value per (row, head, chunk slot)
    st = pr.b * c * pr.h * pr.p * pr.n   # chunk states elements
    fin = pr.b * pr.h * pr.p * pr.n
    Dby = {"none": 0, "head": pr.h * 4, "headdim": pr.h * pr.p * 4}[pr.D]
    return T, c, cq, st, fin, Dby


def triton_kernel_floors(pr: Problem, copy_gbps: float, gemm_tflops: float) -> dict:
    """mamba_ssm 2.3.2.post1's five forward kernels (ssd_combined._mamba_chunk_scan_combined_fwd):
    chunk states fp32 out of _chunk_state_fwd, state_passing writes them in C's dtype, CB fp32."""
    T, c, cq, st, fin, Dby = _common(pr)
    t = flop_terms(pr)
    x = T * pr.h * pr.p * pr.es
    bc = T * pr.g * pr.n * pr.es
    k = {}
    k["_chunk_cumsum_fwd"] = (T * pr.h * pr.es_dt + 2 * pr.h * 4 + 2 * cq * 4, 0)
    k["_chunk_state_fwd"] = (x + bc + 2 * cq * 4 + st * 4, t["state"])
    k["_state_passing_fwd"] = (st * 4 + pr.b * pr.h * c * 4 + fin * pr.es_init + st * pr.es + fin * 4, 0)
    k["_bmm_chunk_fwd"] = (2 * bc + pr.b * c * pr.g * pr.q * pr.q * 4, t["cb"])
    z = x if pr.has_z else 0
    k["_chunk_scan_fwd"] = (pr.b * c * pr.g * pr.q * pr.q * 4 + x + 2 * cq * 4 + bc + st * pr.es + Dby + z
                            + x + z, t["sx"] + t["ch"])
    return {name: floor_ms(by, fl, copy_gbps, gemm_tflops) for name, (by, fl) in k.items()}


def ours_kernel_floors(pr: Problem, copy_gbps: float, gemm_tflops: float, es_state: int = 2,
                       weight_pairs: bool = False) -> dict:
    """Our kernels with the intermediates of src/kernels/common.cuh (SsdParams): chunk_cumsum
    writes cum, dt' and the state weight (fp32, [row][head][chunk][Q]), with weight_pairs (bf16
    calls whose segment sums run, where fused_walk reads fp32 weights) the weights again as bf16
    pairs for the sums (SsdParams::wst_pairs, 4 bytes a slot; where every reader takes the pairs
    they replace the fp32 weights, as many bytes), and the carry factor (fp32, [row][head][chunk]); fwd_pass_state
    reads x, B, the weights and carries and writes the chunk states (state_dtype, es_state bytes) and the final states; compute_out reads x, B, C,
    cum, dt' and the chunk states (CB stays on chip) and writes out. Update with the kernels."""
    T, c, cq, st, fin, Dby = _common(pr)
    t = flop_terms(pr)
    x = T * pr.h * pr.p * pr.es
    bc = T * pr.g * pr.n * pr.es
    z = x if pr.has_z else 0
    carry = pr.b * pr.h * c * 4
    k = {}
    k["chunk_cumsum"] = (T * pr.h * pr.es_dt + 2 * pr.h * 4 + (4 if weight_pairs else 3) * cq * 4 + carry, 0)
    k["fwd_pass_state"] = (x + bc + cq * 4 + carry + fin * pr.es_init + st * es_state + fin * pr.es_final,
                           t["state"])
    k["compute_out"] = (x + 2 * bc + 2 * cq * 4 + st * es_state + Dby + z + x, t["cb"] + t["sx"] + t["ch"])
    # fused_walk (the walk and the output in one kernel: no chunk states in memory) reads x, B, C,
    # cum, dt', the weights and carries and writes out; its segment sums (fwd_pass_state's sum-only
    # instantiation) read x, B, the weights and carries of the segments they sum (at most all).
    k["fused_walk"] = (x + 2 * bc + 3 * cq * 4 + carry + fin * pr.es_init + Dby + z + x + fin * pr.es_final,
                       t["cb"] + t["sx"] + t["ch"] + t["state"])
    k["segment_sums"] = (x + bc + cq * 4 + carry, t["state"])
    return {name: floor_ms(by, fl, copy_gbps, gemm_tflops) for name, (by, fl) in k.items()}


# Substrings that map a profiled kernel name to a floor entry above (first match wins).
TRITON_KERNEL_KEYS = [
    ("_chunk_cumsum_fwd_kernel", "_chunk_cumsum_fwd"),
    ("_chunk_state_fwd_kernel", "_chunk_state_fwd"),
    ("_state_passing_fwd_kernel", "_state_passing_fwd"),
    ("_bmm_chunk_fwd_kernel", "_bmm_chunk_fwd"),
    ("_chunk_scan_fwd_kernel", "_chunk_scan_fwd"),
]
OURS_KERNEL_KEYS = [
    ("chunk_cumsum", "chunk_cumsum"),
    ("fused_walk", "fused_walk"),
    # fwd_pass_state_kernel<T, NT, KS, kStages, kSumsOnly, kCumsum, kSplit>: the sum-only
    # instantiations
    (", true, false, false>(", "segment_sums"),
    (", true, true, false>(", "segment_sums"),
    (", true, false, true>(", "segment_sums"),
    ("fwd_pass_state", "fwd_pass_state"),
    ("compute_out", "compute_out"),
    ("chunk_offsets", "chunk_offsets"),
    ("varlen_states", "varlen_states"),
    ("convert", "convert"),
]


def classify_kernel(name: str, keys) -> str:
    for sub, label in keys:
        if sub in name:
            return label
    return "other: " + (name if len(name) <= 60 else name[:57] + "...")
