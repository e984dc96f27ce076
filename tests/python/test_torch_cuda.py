"""GPU tests of the PyTorch drop-in (and of the DLPack entry on CUDA arrays).

Skipped without torch, without a CUDA device of compute capability 9.0, or when the package
was built with MAMBA2_SSD_CUDA=OFF. Every comparison is against the float64 CPU reference run
on identical inputs (the GPU inputs copied to the CPU and widened to float32, so that the
reference's output is not rounded to 16 bits); the errors are printed.
"""
import collections
import itertools
import math
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
F = torch.nn.functional

import mamba2_ssd  # noqa: E402
from mamba2_ssd import _C, mamba_chunk_scan_combined, mamba_chunk_scan_varlen, torch_ops  # noqa: E402


def _skip_reason():
    if not mamba2_ssd.WITH_CUDA:
        return "mamba2_ssd was built without CUDA (MAMBA2_SSD_CUDA=OFF)"
    if not torch.cuda.is_available():
        return "no CUDA device visible to PyTorch"
    if not mamba2_ssd.cuda_available():
        return "no CUDA device of compute capability 9.0 (Hopper)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

# Relative L2 bounds against float64, as in tests/cpp/test_gpu.cpp.
TOL_OUT = 3e-3
TOL_FINAL = 2.5e-3  # float32 states (see tests/cpp/test_gpu.cpp)
TOL_STATE16 = 4e-3  # states stored in a 16-bit dtype: one more rounding
TOL_FP32_INPUTS = 4e-3  # fp32 inputs are rounded to bf16 for the tensor cores (docs/SEMANTICS.md)
FEW_ELEMENTS = 16384  # below this many elements the error averages over few roundings: 1.5x


def tol(base, t, io_dtype):
    bound = max(base, TOL_FP32_INPUTS) if io_dtype == torch.float32 else base
    return 1.5 * bound if t.numel() < FEW_ELEMENTS else bound


def rel_l2(a, b):
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def report(capsys, line):
    with capsys.disabled():
        print("\n  " + line, end="")


def make(b, l, h, p, g, n, dtype, seed=0, device="cuda"):
    """x, B, C = silu(randn); dt = softplus(randn); A = -uniform(1, 16)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = F.silu(torch.randn(b, l, h, p, device=device, generator=gen)).to(dtype)
    dt = F.softplus(torch.randn(b, l, h, device=device, generator=gen)).to(dtype)
    A = -torch.empty(h, device=device).uniform_(1.0, 16.0, generator=gen)
    B = F.silu(torch.randn(b, l, g, n, device=device, generator=gen)).to(dtype)
    C = F.silu(torch.randn(b, l, g, n, device=device, generator=gen)).to(dtype)
    return x, dt, A, B, C


def cpu32(t):
    """The same values on the CPU, widened to float32 (exact) so that the float64 reference's
    outputs are not rounded to 16 bits."""
    if t is None or not isinstance(t, torch.Tensor):
        return t
    t = t.detach().cpu()
    return t.float() if t.is_floating_point() else t


def reference(fn, *args, **kwargs):
    args = [cpu32(a) for a in args]
    kwargs = {k: cpu32(v) for k, v in kwargs.items()}
    if kwargs.get("state_dtype") is not None:
        kwargs["state_dtype"] = torch.float32
    with torch.no_grad():
        return fn(*args, **kwargs)


def state_tol(t, io_dtype):
    return tol(TOL_STATE16 if t.dtype in (torch.bfloat16, torch.float16) else TOL_FINAL, t, io_dtype)


# ---------------------------------------------------------------- numerics vs the CPU reference

SHAPES = [  # (chunk_size, headdim, dstate, nheads, ngroups)
    (64, 64, 64, 8, 1),
    (128, 64, 128, 8, 2),
    (256, 64, 128, 4, 4),
    (128, 128, 64, 4, 1),
    (256, 128, 16, 4, 2),
]
OPTIONS = {
    "plain": {},
    "D_z_bias_softplus": {"D": "h", "z": True, "dt_bias": True, "dt_softplus": True},
    "Dhp_init_seqidx_limit": {"D": "hp", "initial_states": True, "seq_idx": True, "dt_limit": (0.01, 2.0)},
}


def build_options(opts, x, B, gen_seed=1):
    b, l, h, p = x.shape
    n = B.shape[-1]
    dev = x.device
    gen = torch.Generator(device=dev).manual_seed(gen_seed)
    kw = {}
    if opts.get("D") == "h":
        kw["D"] = torch.randn(h, device=dev, generator=gen)
    elif opts.get("D") == "hp":
        kw["D"] = torch.randn(h, p, device=dev, generator=gen)
    if opts.get("z"):
        kw["z"] = torch.randn(x.shape, device=dev, generator=gen).to(x.dtype)
    if opts.get("dt_bias"):
        kw["dt_bias"] = torch.randn(h, device=dev, generator=gen) - 2.0
    if opts.get("initial_states"):
        kw["initial_states"] = torch.randn(b, h, p, n, device=dev, generator=gen) * 0.1
    if opts.get("seq_idx"):
        seq = torch.zeros(b, l, dtype=torch.int32, device=dev)
        seq[:, l // 3:] = 1
        seq[:, (2 * l) // 3 + 5:] = 2
        kw["seq_idx"] = seq
    for k in ("dt_softplus", "dt_limit"):
        if k in opts:
            kw[k] = opts[k]
    return kw


@pytest.mark.parametrize("opts", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("shape", SHAPES, ids=[f"Q{s[0]}-p{s[1]}-n{s[2]}-h{s[3]}-g{s[4]}" for s in SHAPES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gpu_matches_cpu_reference(dtype, shape, opts, capsys):
    Q, p, n, h, g = shape
    x, dt, A, B, C = make(2, 3 * Q + 37, h, p, g, n, dtype, seed=hash(shape) % 1000)
    kw = build_options(OPTIONS[opts], x, B)
    with torch.no_grad():
        out, final = mamba_chunk_scan_combined(x, dt, A, B, C, Q, return_final_states=True, **kw)
    torch.cuda.synchronize()
    ref_out, ref_final = reference(mamba_chunk_scan_combined, x, dt, A, B, C, Q, return_final_states=True, **kw)
    e_out, e_final = rel_l2(out, ref_out), rel_l2(final, ref_final)
    report(capsys, f"{dtype} {shape} {opts}: out {e_out:.2e}  final {e_final:.2e}")
    assert out.dtype == dtype and final.dtype == torch.float32
    assert e_out <= tol(TOL_OUT, out, dtype)
    assert e_final <= tol(TOL_FINAL, final, dtype)


@pytest.mark.parametrize("state_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_varlen_states(dtype, state_dtype, capsys):
    """mamba_ssm's packed form: batch 1, seq_idx, cu_seqlens, return_varlen_states."""
    Q = 128
    lens = [5, 300, 0, 128, 411, 1]
    L = sum(lens)
    x, dt, A, B, C = make(1, L, 8, 64, 2, 64, dtype, seed=3)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    seq_idx = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens))[None].cuda()
    with torch.no_grad():
        out, final, vs = mamba_chunk_scan_combined(x, dt, A, B, C, Q, seq_idx=seq_idx, cu_seqlens=cu,
                                                   dt_softplus=True, return_final_states=True,
                                                   return_varlen_states=True, state_dtype=state_dtype)
    ref_out, ref_final, ref_vs = reference(mamba_chunk_scan_combined, x, dt, A, B, C, Q, seq_idx=seq_idx,
                                           cu_seqlens=cu, dt_softplus=True, return_final_states=True,
                                           return_varlen_states=True, state_dtype=state_dtype)
    assert vs.dtype == (state_dtype or dtype)
    errs = rel_l2(out, ref_out), rel_l2(final, ref_final), rel_l2(vs, ref_vs)
    report(capsys, f"varlen_states {dtype} state_dtype={state_dtype}: out {errs[0]:.2e} final {errs[1]:.2e} "
                   f"varlen_states {errs[2]:.2e}")
    assert errs[0] <= tol(TOL_OUT, out, dtype) and errs[1] <= tol(TOL_FINAL, final, dtype)
    assert errs[2] <= state_tol(vs, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_varlen_layout(dtype, capsys):
    Q = 64
    lens = [1, 200, 64, 0, 129, 77]
    T = sum(lens)
    S = len(lens)
    h, p, g, n = 8, 64, 2, 128
    x4, dt3, A, B4, C4 = make(1, T, h, p, g, n, dtype, seed=4)
    x, dt, B, C = x4[0], dt3[0], B4[0], C4[0]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int64, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    h0 = torch.randn(S, h, p, n, device="cuda", generator=gen) * 0.1
    D = torch.randn(h, device="cuda", generator=gen)
    z = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    kw = dict(D=D, z=z, initial_states=h0, dt_softplus=True, return_chunk_states=True)
    with torch.no_grad():
        out, final, chunks, offsets = mamba_chunk_scan_varlen(x, dt, A, B, C, Q, cu, **kw)
    ref_out, ref_final, ref_chunks, ref_offsets = reference(mamba_chunk_scan_varlen, x, dt, A, B, C, Q, cu, **kw)
    assert torch.equal(offsets.cpu(), ref_offsets)
    used = int(ref_offsets[-1])
    errs = rel_l2(out, ref_out), rel_l2(final, ref_final), rel_l2(chunks[:used], ref_chunks[:used])
    report(capsys, f"varlen layout {dtype}: out {errs[0]:.2e} final {errs[1]:.2e} chunk_states {errs[2]:.2e}")
    assert errs[0] <= tol(TOL_OUT, out, dtype) and errs[1] <= tol(TOL_FINAL, final, dtype)
    assert errs[2] <= state_tol(chunks[:used], dtype)
    assert bool((chunks[used:] == 0).all())


def test_gpu_out_and_streams():
    x, dt, A, B, C = make(2, 500, 8, 64, 1, 64, torch.bfloat16, seed=6)
    with torch.no_grad():
        ref = mamba_chunk_scan_combined(x, dt, A, B, C, 128, dt_softplus=True)
        out = torch.full_like(x, float("nan"))
        assert mamba_chunk_scan_combined(x, dt, A, B, C, 128, dt_softplus=True, out=out) is out
        assert torch.equal(out, ref)  # bitwise deterministic
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            o2 = mamba_chunk_scan_combined(x, dt, A, B, C, 128, dt_softplus=True)
        torch.cuda.current_stream().wait_stream(s)
        assert torch.equal(o2, ref)


def test_gpu_tune_caches_the_best_setting(tmp_path, monkeypatch):
    cache = tmp_path / "tuning.json"
    monkeypatch.setenv("MAMBA2_SSD_TUNING_CACHE", str(cache))
    mamba2_ssd.reset_tuning_cache()
    try:
        assert mamba2_ssd.tuning_cache_path() == str(cache)
        x, dt, A, B, C = make(2, 1000, 8, 64, 1, 128, torch.bfloat16, seed=7)
        with torch.no_grad():
            before = mamba_chunk_scan_combined(x, dt, A, B, C, 128, D=A.new_ones(8))
            r = mamba2_ssd.tune(x, dt, A, B, C, 128, D=A.new_ones(8), budget_seconds=30)
            after = mamba_chunk_scan_combined(x, dt, A, B, C, 128, D=A.new_ones(8))
        assert r["complete"] and r["key"]
        # 8 chunks: fused_walk at every split that 1-8 segments give (1, 2, 3, 4 and 8 segments;
        # 5-7 run as 4), 4 fwd_pass_state tile/ring settings and the three of 1, 2, 4 and 8 walk
        # segments other than the heuristic's, compute_out heads 1/2/4; a pick other than the
        # heuristic's is timed against it once more (two "recheck" entries, last)
        kinds = collections.Counter(kind for kind, _, _ in r["measured"])
        assert kinds["fused_walk"] == 5, r["measured"]
        assert kinds["fwd_pass_state"] == 7, r["measured"]
        assert kinds["compute_out"] == 3, r["measured"]
        assert kinds["recheck"] in (0, 2) and len(kinds) <= 4, r["measured"]
        assert (kinds["recheck"] == 2) == (r["measured"][-1][0] == "recheck")
        assert r["best"]["fused_walk"] in (1, 2)
        assert 0 < r["best_ms"] <= r["heuristic_ms"]
        assert r["best"]["compute_out_heads_per_cta"] in (1, 2, 4)
        assert cache.exists() and r["key"] in cache.read_text()
        # Every setting computes the same values; walk segments add the states in another order
        # (fp32), and fused_walk rounds other intermediates, so those agree up to that rounding.
        same_split = (r["best"]["pass_state_segments"] == r["heuristic"]["pass_state_segments"]
                      and r["best"]["fused_walk"] == r["heuristic"]["fused_walk"])
        assert rel_l2(after, before) < (1e-6 if same_split else 1e-3)
        with pytest.raises(mamba2_ssd.UnsupportedError):
            mamba2_ssd.tune(x.cpu(), dt.cpu(), A.cpu(), B.cpu(), C.cpu(), 128)
    finally:
        monkeypatch.delenv("MAMBA2_SSD_TUNING_CACHE")
        mamba2_ssd.reset_tuning_cache()


def test_gpu_misaligned_inputs_are_copied():
    """Views the kernels cannot take directly (not 16-byte aligned) are copied, not refused:
    mamba_ssm's Triton kernels accept them."""
    x, dt, A, B, C = make(2, 300, 8, 64, 1, 64, torch.bfloat16, seed=17)
    with torch.no_grad():
        ref, ref_final = mamba_chunk_scan_combined(x, dt, A, B, C, 64, return_final_states=True)
        xb = torch.empty(2, 300, 8 * 64 + 3, dtype=x.dtype, device="cuda")
        xb[..., 1:1 + 8 * 64] = x.flatten(-2)
        xv = xb[..., 1:1 + 8 * 64].unflatten(-1, (8, 64))  # odd offset, odd row stride
        Bb = torch.empty(2, 300, 1, 64 + 1, dtype=B.dtype, device="cuda")
        Bb[..., :64] = B
        Bv = Bb[..., :64]  # row stride 65 elements
        out, final = mamba_chunk_scan_combined(xv, dt, A, Bv, C, 64, return_final_states=True)
    assert torch.equal(out, ref) and torch.equal(final, ref_final)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_other_device():
    x, dt, A, B, C = make(1, 300, 8, 64, 1, 64, torch.bfloat16, seed=7)
    with torch.no_grad():
        ref = mamba_chunk_scan_combined(x, dt, A, B, C, 64)
        args1 = [t.to("cuda:1") for t in (x, dt, A, B, C)]
        got = mamba_chunk_scan_combined(*args1, 64)
    assert got.device == torch.device("cuda:1")
    assert torch.equal(got.cpu(), ref.cpu())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_tensors_on_two_devices():
    # (the binding checks every CUDA tensor's device; validate() then skips its pointer queries)
    x, dt, A, B, C = make(1, 300, 8, 64, 1, 64, torch.bfloat16, seed=7)
    with torch.no_grad(), pytest.raises(ValueError, match=r"^C: expected a tensor on the device of x \(cuda:0\), got cuda:1"):
        mamba_chunk_scan_combined(x, dt, A, B, C.to("cuda:1"), 64)


def test_gpu_errors():
    x, dt, A, B, C = make(1, 128, 4, 64, 1, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=r"^A: expected memory of the same kind as x \(cuda\), got cpu"):
        mamba_chunk_scan_combined(x, dt, A.cpu(), B, C, 64)
    with pytest.raises(NotImplementedError, match=r"^chunk_size: the GPU kernels support chunk_size 64, 128 or 256"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 32)
    x32, dt32, A32, B32, C32 = make(1, 128, 4, 32, 1, 64, torch.bfloat16)
    with pytest.raises(mamba2_ssd.UnsupportedError, match=r"^x: the GPU kernels support headdim 64 or 128, got 32"):
        mamba_chunk_scan_combined(x32, dt32, A32, B32, C32, 64)
    big = torch.zeros(1, 128, 4, 65, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"^out: expected a 16-byte aligned data pointer for the GPU kernels"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 64, out=big[..., 1:])  # outputs are never copied
    with pytest.raises(RuntimeError, match="backward pass is not implemented yet"):
        mamba_chunk_scan_combined(x, dt, torch.nn.Parameter(A), B, C, 64)


# ---------------------------------------------------------------- mamba_ssm's Triton function


def _triton_ref():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as triton_fn
    except Exception as e:  # noqa: BLE001 - ImportError, or a failing extension import
        pytest.skip(f"mamba_ssm.ops.triton.ssd_combined is not importable ({type(e).__name__}: {e})")
    return triton_fn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vs_mamba_ssm_triton(dtype, capsys):
    triton_fn = _triton_ref()
    Q = 256
    lens = [100, 700, 1, 223]
    L = sum(lens)
    x, dt, A, B, C = make(1, L, 16, 64, 2, 128, dtype, seed=8)
    gen = torch.Generator(device="cuda").manual_seed(9)
    D = torch.randn(16, device="cuda", generator=gen)
    dt_bias = torch.randn(16, device="cuda", generator=gen) - 2.0
    z = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    seq_idx = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens))[None].cuda()
    kw = dict(D=D, z=z, dt_bias=dt_bias, seq_idx=seq_idx, cu_seqlens=cu, dt_softplus=True,
              return_final_states=True, return_varlen_states=True)
    with torch.no_grad():
        ours = mamba_chunk_scan_combined(x, dt, A, B, C, Q, **kw)
        theirs = triton_fn(x, dt, A, B, C, Q, **kw)
    ref = reference(mamba_chunk_scan_combined, x, dt, A, B, C, Q, **kw)
    names = ("out", "final_states", "varlen_states")
    for name, o, t, r in zip(names, ours, theirs, ref):
        assert o.shape == t.shape and o.dtype == t.dtype, name
        eo, et = rel_l2(o, r), rel_l2(t, r)
        report(capsys, f"vs float64, {dtype} {name}: mamba2_ssd {eo:.2e}   mamba_ssm triton {et:.2e}")
        assert eo <= (tol(TOL_OUT, o, dtype) if name == "out" else state_tol(o, dtype))


# ---------------------------------------------------------------- torch integration


def test_opcheck_cuda():
    x, dt, A, B, C = make(1, 150, 4, 64, 1, 32, torch.bfloat16, seed=10)
    cu = torch.tensor([0, 60, 150], dtype=torch.int32, device="cuda")
    seq_idx = torch.repeat_interleave(torch.arange(2, dtype=torch.int32), torch.tensor([60, 90]))[None].cuda()
    D = torch.randn(4, device="cuda")
    inf = math.inf
    samples = [
        (x, dt, A, B, C, 64, D, None, None, None, seq_idx, cu, True, 0.0, inf, False, True, True, True, None),
        (x, dt, A, B, C, 128, None, x.clone(), None, None, None, None, False, 0.0, inf, False, False, False, False,
         torch.float32),
        (x[0], dt[0], A, B[0], C[0], 64, D, None, None, None, None, cu, True, 0.0, inf, True, True, False, True, None),
    ]
    for args in samples:
        torch.library.opcheck(torch.ops.mamba2_ssd.chunk_scan_fwd.default, args)
        (x_, dt_, A_, B_, C_, Q, D_, z_, db, h0, seq, cu_, sp, lo, hi, varlen, wf, wv, wc, sdt) = args
        outs = torch_ops._alloc_outputs(x_, B_, C_, cu_, Q, varlen, wf, wv, wc, sdt)
        torch.library.opcheck(torch.ops.mamba2_ssd.chunk_scan_fwd_out.default,
                              (x_, dt_, A_, B_, C_, Q, D_, z_, db, h0, seq, cu_ if (wv or varlen) else None, sp, lo,
                               hi, varlen, sdt, torch.empty_like(x_), *outs))


class Mamba2Like(torch.nn.Module):
    def __init__(self, d_model=256, nheads=8, headdim=64, ngroups=1, dstate=64, chunk_size=128):
        super().__init__()
        self.h, self.p, self.g, self.n, self.q = nheads, headdim, ngroups, dstate, chunk_size
        d_in = 2 * nheads * headdim + 2 * ngroups * dstate + nheads
        self.in_proj = torch.nn.Linear(d_model, d_in, bias=False)
        self.out_proj = torch.nn.Linear(nheads * headdim, d_model, bias=False)
        self.A_log = torch.nn.Parameter(torch.log(torch.empty(nheads).uniform_(1, 16)))
        self.D = torch.nn.Parameter(torch.ones(nheads))
        self.dt_bias = torch.nn.Parameter(torch.rand(nheads) - 2.0)

    def forward(self, u):
        h, p, g, n = self.h, self.p, self.g, self.n
        z, x, B, C, dt = torch.split(self.in_proj(u), [h * p, h * p, g * n, g * n, h], dim=-1)
        A = -torch.exp(self.A_log.float())
        y, final = mamba_chunk_scan_combined(
            x.unflatten(-1, (h, p)), dt, A, B.unflatten(-1, (g, n)), C.unflatten(-1, (g, n)), self.q,
            D=self.D, z=z.unflatten(-1, (h, p)), dt_bias=self.dt_bias, dt_softplus=True, return_final_states=True)
        return self.out_proj(y.flatten(-2)), final


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_fullgraph_cuda(mode, capsys):
    torch._dynamo.reset()
    m = Mamba2Like().cuda().to(torch.bfloat16).eval()
    u = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref_y, ref_final = m(u)
        cm = torch.compile(m, fullgraph=True, mode=mode)
        for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up runs
            y, final = cm(u)
        y, final = y.clone(), final.clone()
    e_y, e_f = rel_l2(y, ref_y), rel_l2(final, ref_final)
    report(capsys, f"torch.compile(mode={mode}) vs eager: y {e_y:.2e} final {e_f:.2e}")
    assert e_y < 2e-2 and e_f < 2e-2  # inductor may compute the projections differently


def test_cuda_graph_capture():
    Q = 128
    x, dt, A, B, C = make(2, 400, 8, 64, 2, 64, torch.bfloat16, seed=11)
    D = torch.randn(8, device="cuda")
    cu = torch.tensor([0, 100, 400], dtype=torch.int32, device="cuda")
    static = [t.clone() for t in (x, dt, A, B, C)]
    static_out = torch.empty_like(x)

    def step(x, dt, A, B, C, out_buf):
        y, final = mamba_chunk_scan_combined(x, dt, A, B, C, Q, D=D, dt_softplus=True, return_final_states=True)
        y2 = mamba_chunk_scan_combined(x, dt, A, B, C, Q, D=D, dt_softplus=True, out=out_buf)
        o3, f3, cs, co = mamba_chunk_scan_varlen(x[0], dt[0], A, B[0], C[0], Q, cu, return_chunk_states=True)
        return y, final, y2, o3, f3, cs, co

    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step(*static, static_out)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step(*static, static_out)
        fresh = make(2, 400, 8, 64, 2, 64, torch.bfloat16, seed=12)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        eager = step(*fresh, torch.empty_like(x))
        torch.cuda.synchronize()
    for i, (c, e) in enumerate(zip(captured, eager)):
        assert torch.equal(c, e), f"output {i} of the replayed graph differs from eager"


# ---------------------------------------------------------------- DLPack on CUDA


@pytest.mark.parametrize("with_workspace", [False, True])
def test_dlpack_torch_cuda(with_workspace):
    x, dt, A, B, C = make(2, 333, 8, 64, 2, 64, torch.bfloat16, seed=13)
    with torch.no_grad():
        ref, ref_final = mamba_chunk_scan_combined(x, dt, A, B, C, 64, dt_softplus=True, return_final_states=True)
    out = torch.empty_like(x)
    final = torch.empty(x.shape[0], x.shape[2], x.shape[3], B.shape[3], device="cuda")
    kw = dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=64, out=out, final_states=final, dt_softplus=True)
    ws = None
    if with_workspace:
        nbytes = mamba2_ssd.workspace_size_dlpack(**kw)
        assert nbytes > 0
        ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    mamba2_ssd.forward_dlpack(**kw, workspace=ws, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert torch.equal(out, ref) and torch.equal(final, ref_final)


def test_dlpack_cupy():
    cp = pytest.importorskip("cupy")
    x, dt, A, B, C = make(1, 300, 8, 64, 1, 64, torch.float16, seed=14)
    with torch.no_grad():
        ref = mamba_chunk_scan_combined(x, dt, A, B, C, 128)
    torch.cuda.synchronize()
    arrays = [cp.from_dlpack(t) for t in (x, dt, A, B, C)]
    out = cp.empty(x.shape, dtype=cp.float16)
    stream = cp.cuda.Stream(non_blocking=True)
    mamba2_ssd.forward_dlpack(x=arrays[0], dt=arrays[1], A=arrays[2], B=arrays[3], C=arrays[4], chunk_size=128,
                              out=out, stream=stream)
    stream.synchronize()
    assert torch.equal(torch.from_dlpack(out), ref)


def test_dlpack_jax_inputs():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU memory to torch
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX has no GPU backend")
    import numpy as np

    x, dt, A, B, C = make(1, 200, 8, 64, 1, 64, torch.float32, seed=15)
    with torch.no_grad():
        ref = mamba_chunk_scan_combined(x, dt, A, B, C, 64)
    jx = [jax.device_put(np.asarray(t.cpu()), gpus[0]) for t in (x, dt, A, B, C)]
    for a in jx:
        a.block_until_ready()
    out = torch.empty_like(x)
    mamba2_ssd.forward_dlpack(x=jx[0], dt=jx[1], A=jx[2], B=jx[3], C=jx[4], chunk_size=64, out=out,
                              stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


# ---------------------------------------------------------------- host overhead


def test_host_overhead_cuda(capsys):
    """Per-call host cost of the torch entry on small CUDA problems (printed, not asserted)."""
    x, dt, A, B, C = make(1, 128, 8, 64, 1, 64, torch.bfloat16, seed=16)
    D = torch.randn(8, device="cuda")
    z = torch.randn_like(x)
    dt_bias = torch.randn(8, device="cuda")
    out = torch.empty_like(x)
    calls = {
        "mamba_chunk_scan_combined(x, dt, A, B, C, 64)": lambda: mamba_chunk_scan_combined(x, dt, A, B, C, 64),
        "... + D, z, dt_bias, softplus, final_states": lambda: mamba_chunk_scan_combined(
            x, dt, A, B, C, 64, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, return_final_states=True),
        "... out=": lambda: mamba_chunk_scan_combined(x, dt, A, B, C, 64, out=out),
    }

    def per_call_us(fn, n_iter=2000, reps=5):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n_iter):
                fn()
            host = time.perf_counter() - t0
            torch.cuda.synchronize()
            best = min(best, host / n_iter * 1e6)
        return best

    def gpu_us(fn, n_iter=500):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n_iter):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / n_iter

    lines = []
    with torch.no_grad():
        for fast in (False, True):
            prev = torch_ops.set_eager_fast_path(fast)
            try:
                for name, fn in calls.items():
                    host = per_call_us(fn)
                    _C._set_skip_forward(True)
                    try:
                        host_noop = per_call_us(fn)
                    finally:
                        _C._set_skip_forward(False)
                    gpu = gpu_us(fn)
                    lines.append(f"{host:7.2f} us/call host (launches enqueued; GPU {gpu:6.2f} us/call), "
                                 f"{host_noop:7.2f} us without launches  fast_path={fast}  {name}")
            finally:
                torch_ops.set_eager_fast_path(prev)
    report(capsys, "host overhead (CUDA, best of 5 x 2000 calls):\n    " + "\n    ".join(lines))
