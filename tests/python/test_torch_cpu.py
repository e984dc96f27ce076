"""The PyTorch drop-in on CPU tensors (the float64 CPU reference behind the same operators the
GPU uses). Skipped when torch is not installed."""
import math
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the numpy-only tests still run)")

import mamba2_ssd  # noqa: E402
from mamba2_ssd import _C, mamba_chunk_scan_combined, mamba_chunk_scan_varlen, torch_ops  # noqa: E402
from mamba2_ssd.torch_ops import NO_BACKWARD_MESSAGE  # noqa: E402
from oracle import rel_l2, scan_batched, scan_varlen  # noqa: E402

TOL32 = 1e-5


def np64(t):
    return None if t is None else t.detach().to(torch.float64).numpy()


def make(b=2, l=45, h=4, p=8, g=2, n=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, l, h, p, generator=gen).to(dtype)
    dt = (torch.randn(b, l, h, generator=gen) * 0.5).to(dtype)
    A = -(torch.rand(h, generator=gen) * 3.5 + 0.5)
    B = torch.randn(b, l, g, n, generator=gen).to(dtype)
    C = torch.randn(b, l, g, n, generator=gen).to(dtype)
    return x, dt, A, B, C


def oracle(x, dt, A, B, C, **kw):
    conv = {k: (np64(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return scan_batched(np64(x), np64(dt), np64(A), np64(B), np64(C), **conv)


# ---------------------------------------------------------------- results


def test_matches_oracle_all_options():
    x, dt, A, B, C = make()
    b, l, h, p = x.shape
    n = B.shape[-1]
    gen = torch.Generator().manual_seed(1)
    D = torch.randn(h, p, generator=gen)
    z = torch.randn(x.shape, generator=gen)
    dt_bias = torch.randn(h, generator=gen)
    h0 = torch.randn(b, h, p, n, generator=gen)
    seq_idx = torch.zeros(b, l, dtype=torch.int32)
    seq_idx[:, 20:] = 1
    seq_idx[1, 33:] = 2
    with torch.no_grad():
        out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 16, D=D, z=z, dt_bias=dt_bias, initial_states=h0,
                                               seq_idx=seq_idx, dt_softplus=True, dt_limit=(0.01, 5.0),
                                               return_final_states=True)
    ref_out, ref_final, _, _ = oracle(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, initial_states=h0,
                                      seq_idx=seq_idx, dt_softplus=True, dt_limit=(0.01, 5.0))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert final.shape == (b, h, p, n) and final.dtype == torch.float32
    assert rel_l2(out, ref_out) < TOL32
    assert rel_l2(final, ref_final) < TOL32


def test_bfloat16_inputs():
    x, dt, A, B, C = make(dtype=torch.bfloat16)
    out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 16, dt_softplus=True, return_final_states=True)
    ref_out, ref_final, _, _ = oracle(x, dt, A, B, C, dt_softplus=True)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert rel_l2(out.float(), ref_out) < 5e-3  # one bf16 rounding of the output
    assert rel_l2(final, ref_final) < TOL32


def test_return_structure():
    x, dt, A, B, C = make(b=1)
    cu = torch.tensor([0, 10, 45], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(2, dtype=torch.int32), torch.tensor([10, 35]))[None]
    base = dict(seq_idx=seq_idx, cu_seqlens=cu)
    r = mamba_chunk_scan_combined(x, dt, A, B, C, 16, **base)
    assert isinstance(r, torch.Tensor) and r.shape == x.shape
    r = mamba_chunk_scan_combined(x, dt, A, B, C, 16, **base, return_final_states=True)
    assert isinstance(r, tuple) and len(r) == 2 and r[1].shape == (1, 4, 8, 16)
    r = mamba_chunk_scan_combined(x, dt, A, B, C, 16, **base, return_varlen_states=True)
    assert isinstance(r, tuple) and len(r) == 2 and r[1].shape == (2, 4, 8, 16)
    r = mamba_chunk_scan_combined(x, dt, A, B, C, 16, **base, return_final_states=True, return_varlen_states=True)
    assert isinstance(r, tuple) and len(r) == 3
    out, final, vstates = r
    assert final.shape == (1, 4, 8, 16) and vstates.shape == (2, 4, 8, 16)
    _, _, _, states = oracle(x, dt, A, B, C, seq_idx=seq_idx)
    assert rel_l2(vstates[0], states[0, 9]) < TOL32
    assert rel_l2(vstates[1], states[0, 44]) < TOL32
    assert rel_l2(final[0], states[0, 44]) < TOL32


def test_cu_seqlens_ignored_without_return_varlen_states():
    x, dt, A, B, C = make()
    garbage = torch.tensor([[3.0]])  # wrong rank and dtype, batch 2: all would be errors if used
    out = mamba_chunk_scan_combined(x, dt, A, B, C, 16, cu_seqlens=garbage)
    assert torch.equal(out, mamba_chunk_scan_combined(x, dt, A, B, C, 16))


def test_return_varlen_states_requires_cu_seqlens():
    x, dt, A, B, C = make(b=1)
    with pytest.raises(ValueError, match="cu_seqlens: must be provided if return_varlen_states is True"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, return_varlen_states=True)


def test_out_in_place():
    x, dt, A, B, C = make()
    ref, ref_final = mamba_chunk_scan_combined(x, dt, A, B, C, 16, return_final_states=True)
    out = torch.full_like(x, float("nan"))
    r = mamba_chunk_scan_combined(x, dt, A, B, C, 16, out=out)
    assert r is out
    assert torch.equal(out, ref)
    out2 = torch.full_like(x, float("nan"))
    r, final = mamba_chunk_scan_combined(x, dt, A, B, C, 16, out=out2, return_final_states=True)
    assert r is out2 and torch.equal(out2, ref) and torch.equal(final, ref_final)
    # a strided out (a view into a larger buffer)
    big = torch.full((*x.shape[:-1], 2 * x.shape[-1]), float("nan"))
    mamba_chunk_scan_combined(x, dt, A, B, C, 16, out=big[..., : x.shape[-1]])
    assert torch.equal(big[..., : x.shape[-1]], ref)
    assert torch.isnan(big[..., x.shape[-1]:]).all()


def test_state_dtype():
    x, dt, A, B, C = make(b=1, dtype=torch.bfloat16)
    cu = torch.tensor([0, 20, 45], dtype=torch.int32)
    _, vs = mamba_chunk_scan_combined(x, dt, A, B, C, 16, cu_seqlens=cu, return_varlen_states=True)
    assert vs.dtype == torch.bfloat16  # default: the dtype of C, as mamba_ssm
    _, vs32 = mamba_chunk_scan_combined(x, dt, A, B, C, 16, cu_seqlens=cu, return_varlen_states=True,
                                        state_dtype=torch.float32)
    assert vs32.dtype == torch.float32
    assert rel_l2(vs.float(), vs32) < 5e-3
    with pytest.raises(ValueError, match="state_dtype"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, state_dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^state_dtype: expected float32 or bfloat16"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, state_dtype=torch.float16)  # bf16 inputs
    with pytest.raises(TypeError, match="state_dtype"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, state_dtype="float32")


def test_upcasts_and_conversions():
    """bf16 A/D/dt_bias are upcast, int64 seq_idx converted, a non-contiguous last dim copied."""
    x, dt, A, B, C = make()
    h, p = x.shape[2], x.shape[3]
    D = torch.randn(h, p).bfloat16()
    dt_bias = torch.randn(h).bfloat16()
    A16 = A.bfloat16()
    seq_idx = torch.zeros(x.shape[:2], dtype=torch.int64)
    seq_idx[:, 30:] = 1
    ref = mamba_chunk_scan_combined(x, dt, A16.float(), B, C, 16, D=D.float(), dt_bias=dt_bias.float(),
                                    seq_idx=seq_idx.int(), dt_softplus=True)
    got = mamba_chunk_scan_combined(x, dt, A16, B, C, 16, D=D, dt_bias=dt_bias, seq_idx=seq_idx, dt_softplus=True)
    assert torch.equal(got, ref)
    Dt = D.t().contiguous().t()  # bf16, stride(-1) != 1: upcast, then made contiguous
    assert Dt.stride(-1) != 1
    got = mamba_chunk_scan_combined(x, dt, A16, B, C, 16, D=Dt, dt_bias=dt_bias, seq_idx=seq_idx, dt_softplus=True)
    assert torch.equal(got, ref)
    xt = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, stride(-1) != 1
    assert xt.stride(-1) != 1
    got = mamba_chunk_scan_combined(xt, dt, A16, B, C, 16, D=D, dt_bias=dt_bias, seq_idx=seq_idx, dt_softplus=True)
    assert torch.equal(got, ref)


def test_mamba2_style_views():
    """x, B, C, dt as slices of one projection (as a Mamba-2 layer makes them): no copies."""
    b, l, h, p, g, n = 2, 40, 4, 8, 1, 16
    zxbcdt = torch.randn(b, l, h * p + 2 * g * n + h)
    x = zxbcdt[..., : h * p].unflatten(-1, (h, p))
    B = zxbcdt[..., h * p: h * p + g * n].unflatten(-1, (g, n))
    C = zxbcdt[..., h * p + g * n: h * p + 2 * g * n].unflatten(-1, (g, n))
    dt = zxbcdt[..., h * p + 2 * g * n:]
    A = -torch.rand(h) * 3 - 0.5
    out = mamba_chunk_scan_combined(x, dt, A, B, C, 16, dt_softplus=True)
    ref_out, _, _, _ = oracle(x, dt, A, B, C, dt_softplus=True)
    assert rel_l2(out, ref_out) < TOL32


# ---------------------------------------------------------------- varlen serving entry


def test_varlen_entry():
    T, h, p, g, n, Q = 77, 4, 8, 2, 16, 16
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, h, p, generator=gen)
    dt = torch.randn(T, h, generator=gen)
    A = -(torch.rand(h, generator=gen) * 3 + 0.5)
    B = torch.randn(T, g, n, generator=gen)
    C = torch.randn(T, g, n, generator=gen)
    D = torch.randn(h, generator=gen)
    cu = torch.tensor([0, 30, 30, 31, 77], dtype=torch.int64)
    S = cu.numel() - 1
    h0 = torch.randn(S, h, p, n, generator=gen)
    out, final = mamba_chunk_scan_varlen(x, dt, A, B, C, Q, cu, D=D, initial_states=h0, dt_softplus=True)
    ref_out, ref_final, ref_chunks = scan_varlen(np64(x), np64(dt), np64(A), np64(B), np64(C), cu.numpy(), Q,
                                                 D=np64(D), initial_states=np64(h0), dt_softplus=True)
    assert out.shape == x.shape and final.shape == (S, h, p, n) and final.dtype == torch.float32
    assert rel_l2(out, ref_out) < TOL32
    assert rel_l2(final, ref_final) < TOL32
    out2 = torch.empty_like(x)
    r = mamba_chunk_scan_varlen(x, dt, A, B, C, Q, cu, D=D, initial_states=h0, dt_softplus=True,
                                return_chunk_states=True, out=out2)
    assert len(r) == 4 and r[0] is out2
    _, final2, chunks, offsets = r
    assert torch.equal(out2, out) and torch.equal(final2, final)
    assert chunks.shape == (mamba2_ssd.max_varlen_chunks(T, S, Q), h, p, n) and chunks.dtype == torch.float32
    assert offsets.dtype == torch.int32 and offsets.tolist() == [0, 2, 2, 3, 6]
    for i in range(S):
        got = chunks[offsets[i]: offsets[i + 1]]
        if got.numel():
            assert rel_l2(got, ref_chunks[i]) < TOL32


def test_varlen_entry_errors():
    x = torch.randn(10, 4, 8)
    dt = torch.randn(10, 4)
    A = -torch.rand(4)
    B = torch.randn(10, 1, 16)
    with pytest.raises(TypeError, match="cu_seqlens"):
        mamba_chunk_scan_varlen(x, dt, A, B, B, 16, None)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected cu_seqlens\[2\] == 10 \(total_tokens\), got 9"):
        mamba_chunk_scan_varlen(x, dt, A, B, B, 16, torch.tensor([0, 4, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^x: expected rank 3 \(total_tokens, nheads, headdim\)"):
        mamba_chunk_scan_varlen(x[None], dt, A, B, B, 16, torch.tensor([0, 10], dtype=torch.int32))


# ---------------------------------------------------------------- errors


def test_errors_carry_cpp_messages():
    x, dt, A, B, C = make()
    with pytest.raises(ValueError) as ei:
        mamba_chunk_scan_combined(x[0], dt, A, B, C, 16)
    assert str(ei.value).startswith("x: expected rank 4 (batch, seqlen, nheads, headdim) for the batched layout")
    assert isinstance(ei.value, mamba2_ssd.InvalidArgumentError) and ei.value.argument == "x"
    with pytest.raises(ValueError, match=r"^C: expected dtype float32 \(the dtype of x\), got bfloat16$"):
        mamba_chunk_scan_combined(x, dt, A, B, C.bfloat16(), 16)
    with pytest.raises(ValueError, match=r"^x: unsupported dtype torch.float64"):
        mamba_chunk_scan_combined(x.double(), dt, A, B, C, 16)
    with pytest.raises(ValueError, match=r"^B: expected ngroups to divide nheads"):
        B3 = torch.zeros(*B.shape[:2], 3, 16)
        mamba_chunk_scan_combined(x, dt, A, B3, B3, 16)
    with pytest.raises(ValueError, match=r"^seq_idx: expected non-decreasing values"):
        seq = torch.zeros(x.shape[:2], dtype=torch.int32)
        seq[:, 5] = 1
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, seq_idx=seq)
    with pytest.raises(ValueError, match=r"^chunk_size: expected chunk_size >= 1"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 0)


def test_errors_python_types():
    x, dt, A, B, C = make()
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list"):
        mamba_chunk_scan_combined([1.0], dt, A, B, C, 16)
    with pytest.raises(TypeError, match=r"^D: expected a torch.Tensor, got ndarray"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, D=np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"^chunk_size: expected an int, got float"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16.0)
    with pytest.raises(TypeError, match=r"^dt_limit"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, dt_limit=None)
    with pytest.raises(TypeError, match=r"^out: expected a torch.Tensor"):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, out=np.empty(3))


def test_grad_raises():
    x, dt, A, B, C = make()
    xg = x.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="backward pass is not implemented yet"):
        mamba_chunk_scan_combined(xg, dt, A, B, C, 16)
    A_param = torch.nn.Parameter(A.clone())
    with pytest.raises(RuntimeError) as ei:
        mamba_chunk_scan_combined(x, dt, A_param, B, C, 16)
    assert str(ei.value) == NO_BACKWARD_MESSAGE
    with pytest.raises(RuntimeError, match="backward pass is not implemented yet"):
        mamba_chunk_scan_varlen(x[0], dt[0], A_param, B[0], C[0], 16, torch.tensor([0, 45], dtype=torch.int32))
    ref = mamba_chunk_scan_combined(x, dt, A, B, C, 16)
    with torch.no_grad():
        assert torch.equal(mamba_chunk_scan_combined(xg, dt, A_param, B, C, 16), ref)
    with torch.inference_mode():
        assert torch.equal(mamba_chunk_scan_combined(xg, dt, A_param, B, C, 16), ref)


def test_lazy_import_names():
    assert mamba2_ssd.mamba_chunk_scan_combined is mamba_chunk_scan_combined
    assert "mamba_chunk_scan_varlen" in dir(mamba2_ssd)
    with pytest.raises(AttributeError):
        mamba2_ssd.does_not_exist  # noqa: B018


# ---------------------------------------------------------------- operators


def test_ops_direct():
    x, dt, A, B, C = make()
    res = torch.ops.mamba2_ssd.chunk_scan_fwd(x, dt, A, B, C, 16, None, None, None, None, None, None, False, 0.0,
                                              math.inf, False, True, False, True, None)
    assert isinstance(res, list) and len(res) == 3  # out, final_states, chunk_states
    out, final, chunks = res
    assert chunks.shape == (2, 3, 4, 8, 16)
    ref_out, ref_final, ref_chunks, _ = oracle(x, dt, A, B, C, chunk_size=16)
    assert rel_l2(out, ref_out) < TOL32 and rel_l2(final, ref_final) < TOL32 and rel_l2(chunks, ref_chunks) < TOL32
    out2 = torch.empty_like(x)
    chunks2 = torch.empty_like(chunks)
    r = torch.ops.mamba2_ssd.chunk_scan_fwd_out(x, dt, A, B, C, 16, None, None, None, None, None, None, False, 0.0,
                                                math.inf, False, None, out2, None, None, chunks2, None)
    assert r is None
    assert torch.equal(out2, out) and torch.equal(chunks2, chunks)


def _opcheck_samples():
    x, dt, A, B, C = make(b=1, l=20, seed=5)
    h, p, n = x.shape[2], x.shape[3], B.shape[3]
    D = torch.randn(h)
    z = torch.randn_like(x)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(2, dtype=torch.int32), torch.tensor([7, 13]))[None]
    h0 = torch.randn(1, h, p, n)
    yield (x, dt, A, B, C, 8, D, z, None, h0, seq_idx, cu, True, 0.0, math.inf, False, True, True, True, None)
    yield (x, dt, A, B, C, 16, None, None, None, None, None, None, False, 0.0, 2.0, False, False, False, False,
           torch.bfloat16)
    # varlen layout
    S = 2
    yield (x[0], dt[0], A, B[0], C[0], 8, D, z[0], None, torch.randn(S, h, p, n), None, cu, True, 0.0, math.inf,
           True, True, False, True, None)


def test_opcheck():
    for args in _opcheck_samples():
        torch.library.opcheck(torch.ops.mamba2_ssd.chunk_scan_fwd.default, args)
    for args in _opcheck_samples():
        (x, dt, A, B, C, Q, D, z, dtb, h0, seq, cu, sp, lo, hi, varlen, wf, wv, wc, sdt) = args
        out = torch.empty_like(x)
        outs = torch_ops._alloc_outputs(x, B, C, cu, Q, varlen, wf, wv, wc, sdt)
        if not wv and not varlen:
            cu = None  # the batched layout takes cu_seqlens only with varlen_states
        torch.library.opcheck(torch.ops.mamba2_ssd.chunk_scan_fwd_out.default,
                              (x, dt, A, B, C, Q, D, z, dtb, h0, seq, cu, sp, lo, hi, varlen, sdt, out, *outs))


class Mamba2Like(torch.nn.Module):
    """The SSD part of a Mamba-2 layer, with the scan imported from mamba2_ssd."""

    def __init__(self, nheads=4, headdim=8, ngroups=1, dstate=16, chunk_size=16):
        super().__init__()
        self.h, self.p, self.g, self.n, self.q = nheads, headdim, ngroups, dstate, chunk_size
        d_in = nheads * headdim * 2 + 2 * ngroups * dstate + nheads
        self.in_proj = torch.nn.Linear(16, d_in, bias=False)
        self.A_log = torch.nn.Parameter(torch.log(torch.rand(nheads) * 3 + 1))
        self.D = torch.nn.Parameter(torch.ones(nheads))
        self.dt_bias = torch.nn.Parameter(torch.rand(nheads))

    def forward(self, u):
        b, l, _ = u.shape
        h, p, g, n = self.h, self.p, self.g, self.n
        z, x, B, C, dt = torch.split(self.in_proj(u), [h * p, h * p, g * n, g * n, h], dim=-1)
        A = -torch.exp(self.A_log.float())
        y, final = mamba_chunk_scan_combined(
            x.unflatten(-1, (h, p)), dt, A, B.unflatten(-1, (g, n)), C.unflatten(-1, (g, n)), self.q,
            D=self.D, z=z.unflatten(-1, (h, p)), dt_bias=self.dt_bias, dt_softplus=True, return_final_states=True)
        return y.flatten(-2), final


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    torch._dynamo.reset()
    m = Mamba2Like().eval()
    u = torch.randn(2, 40, 16)
    with torch.no_grad():
        ref_y, ref_final = m(u)
        cm = torch.compile(m, fullgraph=True, backend=backend)
        y, final = cm(u)
        y2, _ = cm(torch.randn(2, 40, 16))  # second call: no recompilation needed for same shapes
    assert y2.shape == y.shape
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, ref_final, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_out_and_varlen(backend):
    torch._dynamo.reset()

    def f(x, dt, A, B, C, cu, out):
        mamba_chunk_scan_combined(x, dt, A, B, C, 16, out=out)
        o2, final, chunks, offsets = mamba_chunk_scan_varlen(x[0], dt[0], A, B[0], C[0], 16, cu,
                                                             return_chunk_states=True)
        return out * 2, o2, final, chunks[: offsets.shape[0]], offsets

    x, dt, A, B, C = make(b=1)
    cu = torch.tensor([0, 20, 45], dtype=torch.int32)
    with torch.no_grad():
        ref = f(x, dt, A, B, C, cu, torch.empty_like(x))
        got = torch.compile(f, fullgraph=True, backend=backend)(x, dt, A, B, C, cu, torch.empty_like(x))
    for r, g_ in zip(ref, got):
        assert torch.equal(r, g_)


def test_torch_compile_dynamic_shapes():
    torch._dynamo.reset()

    def f(x, dt, A, B, C, cu):
        y, final, chunks = mamba_chunk_scan_varlen(x, dt, A, B, C, 16, cu, return_chunk_states=True)[:3]
        return y, final, chunks

    cf = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for T, cuts in ((45, [0, 20, 45]), (70, [0, 5, 33, 70]), (100, [0, 100])):
        x, dt, A, B, C = make(b=1, l=T, seed=T)
        cu = torch.tensor(cuts, dtype=torch.int32)
        args = (x[0], dt[0], A, B[0], C[0], cu)
        with torch.no_grad():
            ref = f(*args)
            got = cf(*args)
        for r, g_ in zip(ref, got):
            assert r.shape == g_.shape and torch.equal(r, g_)


def test_eager_fast_path():
    """The dispatcher bypass (on by default) gives the same results as the operator and steps
    aside whenever something intercepts operators (here: FakeTensorMode) or the profiler
    records (the call then shows up as the mamba2_ssd op)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, dt, A, B, C = make()
    prev = torch_ops.set_eager_fast_path(False)
    try:
        ref, ref_final = mamba_chunk_scan_combined(x, dt, A, B, C, 16, return_final_states=True)
    finally:
        torch_ops.set_eager_fast_path(prev)
    prev = torch_ops.set_eager_fast_path(True)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            mamba_chunk_scan_combined(x, dt, A, B, C, 16)
        assert any(e.name.startswith("mamba2_ssd::chunk_scan_fwd") for e in prof.events())
        out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 16, return_final_states=True)
        assert torch.equal(out, ref) and torch.equal(final, ref_final)
        o = torch.empty_like(x)
        assert mamba_chunk_scan_combined(x, dt, A, B, C, 16, out=o) is o and torch.equal(o, ref)
        with FakeTensorMode() as mode:
            fx, fdt, fA, fB, fC = (mode.from_tensor(t) for t in (x, dt, A, B, C))
            fout, ffinal = mamba_chunk_scan_combined(fx, fdt, fA, fB, fC, 16, return_final_states=True)
        assert type(fout).__name__ == "FakeTensor" and fout.shape == x.shape and ffinal.shape == final.shape
        with torch.no_grad():
            cf = torch.compile(lambda *a: mamba_chunk_scan_combined(*a, 16), fullgraph=True, backend="aot_eager")
            assert torch.equal(cf(x, dt, A, B, C), ref)
    finally:
        torch_ops.set_eager_fast_path(prev)


def test_host_overhead_cpu(capsys):
    """Host overhead per call, CPU tensors (a proxy for the GPU path's Python/binding cost).
    Printed, not asserted (timings on shared CI machines are noisy)."""
    b, l, h, p, g, n = 1, 64, 8, 64, 1, 64
    x = torch.randn(b, l, h, p)
    dt = torch.randn(b, l, h)
    A = -torch.rand(h)
    B = torch.randn(b, l, g, n)
    C = torch.randn(b, l, g, n)
    D = torch.randn(h)
    z = torch.randn_like(x)
    dt_bias = torch.randn(h)
    out = torch.empty_like(x)

    def best_us(fn, n_iter=500, reps=5):
        for _ in range(50):
            fn()
        best = math.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n_iter):
                fn()
            best = min(best, (time.perf_counter() - t0) / n_iter * 1e6)
        return best

    calls = {
        "mamba_chunk_scan_combined(x, dt, A, B, C, Q)": lambda: mamba_chunk_scan_combined(x, dt, A, B, C, 64),
        "... + D, z, dt_bias, softplus, return_final_states": lambda: mamba_chunk_scan_combined(
            x, dt, A, B, C, 64, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, return_final_states=True),
        "... out= (no allocation)": lambda: mamba_chunk_scan_combined(x, dt, A, B, C, 64, out=out),
        "_C.forward_torch alone (5 inputs + out)": lambda: _C.forward_torch(
            x, dt, A, B, C, 64, None, None, None, None, None, None, False, 0.0, math.inf, False, -1, out, None, None,
            None, None, 0, -1),
    }
    lines = []
    with torch.no_grad():
        for fast in (False, True):
            prev = torch_ops.set_eager_fast_path(fast)
            _C._set_skip_forward(True)
            try:
                for name, fn in calls.items():
                    if fast and name.startswith("_C."):
                        continue
                    lines.append(f"  {best_us(fn):7.2f} us  {name}  [no launch: validation only; "
                                 f"fast_path={fast}]")
            finally:
                _C._set_skip_forward(False)
                torch_ops.set_eager_fast_path(prev)
        lines.append(f"  {best_us(calls[next(iter(calls))], n_iter=20, reps=3):7.2f} us  full call incl. the float64 "
                     "CPU reference (b=1, l=64, h=8, p=64, n=64)")
    with capsys.disabled():
        print("\nhost overhead per call (CPU tensors, best of 5):\n" + "\n".join(lines))
