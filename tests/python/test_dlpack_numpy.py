"""The DLPack entry point on numpy arrays (CPU: the float64 reference through the binding).

Needs only numpy: runs in CI without torch. Results are compared with the independent
token-by-token recurrence of oracle.py.
"""
import math
import zlib

import numpy as np
import pytest

import mamba2_ssd
from oracle import rel_l2, scan_batched, scan_varlen

TOL32 = 1e-5  # float32 outputs of a float64 computation vs a float64 oracle
TOL16 = 2e-3  # float16 outputs


def make_batched(rng, b=2, l=37, h=4, p=8, g=2, n=16, dtype=np.float32):
    x = rng.standard_normal((b, l, h, p)).astype(dtype)
    dt = (rng.standard_normal((b, l, h)) * 0.5).astype(dtype)
    A = -rng.uniform(0.5, 4.0, h).astype(np.float32)
    B = rng.standard_normal((b, l, g, n)).astype(dtype)
    C = rng.standard_normal((b, l, g, n)).astype(dtype)
    return x, dt, A, B, C


def run_batched(x, dt, A, B, C, chunk_size, *, want_final=True, want_chunks=False, **kw):
    out = np.full_like(x, np.nan)
    b, l, h, p = x.shape
    n = B.shape[-1]
    final = np.full((b, h, p, n), np.nan, np.float32) if want_final else None
    sdt = kw.get("state_dtype") or C.dtype
    chunks = None
    if want_chunks:
        chunks = np.full((b, -(-l // chunk_size), h, p, n), np.nan, sdt)
    mamba2_ssd.forward_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=chunk_size, out=out, final_states=final,
                              chunk_states=chunks, **kw)
    return out, final, chunks


OPTION_SETS = {
    "plain": {},
    "D_z_bias_softplus": {"D": "h", "z": True, "dt_bias": True, "dt_softplus": True},
    "D_hp_dt_limit": {"D": "hp", "dt_limit": (0.05, 0.8), "dt_softplus": True},
    "initial_states": {"initial_states": True},
    "seq_idx": {"seq_idx": True},
    "seq_idx_initial_states": {"seq_idx": True, "initial_states": True, "z": True},
}


@pytest.mark.parametrize("chunk_size", [8, 16, 64])
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_batched_matches_oracle(opts, chunk_size):
    rng = np.random.default_rng(zlib.crc32(f"{opts}-{chunk_size}".encode()))
    o = OPTION_SETS[opts]
    x, dt, A, B, C = make_batched(rng)
    b, l, h, p = x.shape
    n = B.shape[-1]
    kw = {}
    if o.get("D") == "h":
        kw["D"] = rng.standard_normal(h).astype(np.float32)
    elif o.get("D") == "hp":
        kw["D"] = rng.standard_normal((h, p)).astype(np.float32)
    if o.get("z"):
        kw["z"] = rng.standard_normal(x.shape).astype(np.float32)
    if o.get("dt_bias"):
        kw["dt_bias"] = rng.standard_normal(h).astype(np.float32)
    if o.get("initial_states"):
        kw["initial_states"] = rng.standard_normal((b, h, p, n)).astype(np.float32)
    if o.get("seq_idx"):
        cuts = np.sort(rng.choice(np.arange(1, l), size=(b, 3), replace=False), axis=1)
        kw["seq_idx"] = np.stack([np.searchsorted(cuts[i], np.arange(l), side="right") for i in range(b)]).astype(
            np.int32)
    for k in ("dt_softplus", "dt_limit"):
        if k in o:
            kw[k] = o[k]

    out, final, chunks = run_batched(x, dt, A, B, C, chunk_size, want_chunks=True, **kw)
    ref_out, ref_final, ref_chunks, _ = scan_batched(x, dt, A, B, C, chunk_size, **kw)
    assert rel_l2(out, ref_out) < TOL32
    assert rel_l2(final, ref_final) < TOL32
    assert rel_l2(chunks, ref_chunks) < TOL32


def test_float16_inputs():
    rng = np.random.default_rng(1)
    x, dt, A, B, C = make_batched(rng, dtype=np.float16)
    out, final, chunks = run_batched(x, dt, A, B, C, 16, want_chunks=True, dt_softplus=True,
                                     state_dtype="float32")
    assert out.dtype == np.float16 and chunks.dtype == np.float32
    ref_out, ref_final, ref_chunks, _ = scan_batched(x, dt, A, B, C, 16, dt_softplus=True)
    assert rel_l2(out, ref_out) < TOL16
    assert rel_l2(final, ref_final) < TOL32  # final states are float32
    assert rel_l2(chunks, ref_chunks) < TOL32


def test_default_state_dtype_is_dtype_of_C():
    rng = np.random.default_rng(2)
    x, dt, A, B, C = make_batched(rng, dtype=np.float16)
    b, l, h, p = x.shape
    n = B.shape[-1]
    out = np.empty_like(x)
    bad = np.empty((b, -(-l // 16), h, p, n), np.float32)  # fp16 inputs: states default to fp16
    with pytest.raises(ValueError, match=r"^chunk_states: expected dtype float16 \(the state dtype\)"):
        mamba2_ssd.forward_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, out=out, chunk_states=bad)
    good = np.empty(bad.shape, np.float16)
    mamba2_ssd.forward_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, out=out, chunk_states=good)
    assert np.isfinite(good).all()


def test_strided_inputs():
    """Outer dimensions with arbitrary strides (views into larger buffers) need no copies."""
    rng = np.random.default_rng(3)
    b, l, h, p, g, n = 2, 33, 4, 8, 1, 16
    big = rng.standard_normal((b, l, h * p + 2 * g * n + h + 5)).astype(np.float32)
    x = big[..., : h * p].reshape(b, l, h, p)
    B = big[..., h * p: h * p + g * n].reshape(b, l, g, n)
    C = big[..., h * p + g * n: h * p + 2 * g * n].reshape(b, l, g, n)
    dt = big[..., h * p + 2 * g * n: h * p + 2 * g * n + h]
    assert not x.flags.c_contiguous and not dt.flags.c_contiguous
    A = -rng.uniform(0.5, 4.0, h).astype(np.float32)
    out, final, _ = run_batched(x, dt, A, B, C, 16, dt_softplus=True)
    ref_out, ref_final, _, _ = scan_batched(x, dt, A, B, C, dt_softplus=True)
    assert rel_l2(out, ref_out) < TOL32
    assert rel_l2(final, ref_final) < TOL32
    # a strided output
    out_big = np.full((b, l, h, 2 * p), np.nan, np.float32)
    mamba2_ssd.forward_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, out=out_big[..., :p], dt_softplus=True)
    assert rel_l2(out_big[..., :p], ref_out) < TOL32
    assert np.isnan(out_big[..., p:]).all()


def test_varlen_states_batched_layout():
    """mamba_ssm's cu_seqlens + varlen_states (batch 1, packed sequences with seq_idx)."""
    rng = np.random.default_rng(4)
    x, dt, A, B, C = make_batched(rng, b=1, l=70)
    h, p, n = x.shape[2], x.shape[3], B.shape[-1]
    cu = np.array([0, 5, 5, 40, 70], np.int32)  # includes an empty sequence
    seq_idx = np.repeat(np.arange(4), np.diff(cu)).astype(np.int32)[None]
    out = np.empty_like(x)
    vstates = np.full((4, h, p, n), np.nan, np.float32)
    mamba2_ssd.forward_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, out=out, seq_idx=seq_idx, cu_seqlens=cu,
                              varlen_states=vstates, dt_softplus=True)
    ref_out, _, _, states = scan_batched(x, dt, A, B, C, seq_idx=seq_idx, dt_softplus=True)
    assert rel_l2(out, ref_out) < TOL32
    for i in range(4):
        s, e = cu[i], cu[i + 1]
        want = np.zeros((h, p, n)) if e == s else states[0, e - 1]
        assert rel_l2(vstates[i], want) < TOL32, i


@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_varlen_layout(cu_dtype):
    rng = np.random.default_rng(5)
    T, h, p, g, n, Q = 90, 4, 8, 2, 16, 16
    cu = np.array([0, 17, 17, 50, 51, 90], cu_dtype)
    S = len(cu) - 1
    x = rng.standard_normal((T, h, p)).astype(np.float32)
    dt = rng.standard_normal((T, h)).astype(np.float32)
    A = -rng.uniform(0.5, 4.0, h).astype(np.float32)
    B = rng.standard_normal((T, g, n)).astype(np.float32)
    C = rng.standard_normal((T, g, n)).astype(np.float32)
    z = rng.standard_normal((T, h, p)).astype(np.float32)
    D = rng.standard_normal(h).astype(np.float32)
    h0 = rng.standard_normal((S, h, p, n)).astype(np.float32)
    cap = mamba2_ssd.max_varlen_chunks(T, S, Q)
    assert cap == S + (T - S) // Q
    out = np.full_like(x, np.nan)
    final = np.full((S, h, p, n), np.nan, np.float32)
    chunks = np.full((cap, h, p, n), np.nan, np.float32)
    offsets = np.full(S + 1, -1, np.int32)
    mamba2_ssd.forward_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=Q, out=out, layout="varlen", cu_seqlens=cu,
                              z=z, D=D, initial_states=h0, dt_softplus=True, final_states=final,
                              chunk_states=chunks, chunk_offsets=offsets)
    ref_out, ref_final, ref_chunks = scan_varlen(x, dt, A, B, C, cu, Q, D=D, z=z, initial_states=h0,
                                                 dt_softplus=True)
    assert rel_l2(out, ref_out) < TOL32
    assert rel_l2(final, ref_final) < TOL32
    lens = np.diff(cu)
    assert offsets.tolist() == np.concatenate([[0], np.cumsum(-(-lens // Q))]).tolist()
    for i in range(S):
        got = chunks[offsets[i]: offsets[i + 1]]
        assert got.shape == ref_chunks[i].shape
        if got.size:
            assert rel_l2(got, ref_chunks[i]) < TOL32


def test_workspace_size_cpu_is_zero():
    rng = np.random.default_rng(6)
    x, dt, A, B, C = make_batched(rng)
    out = np.empty_like(x)
    assert mamba2_ssd.workspace_size_dlpack(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, out=out) == 0


def test_module_attributes():
    assert isinstance(mamba2_ssd.__version__, str) and mamba2_ssd.__version__.count(".") == 2
    assert isinstance(mamba2_ssd.WITH_CUDA, bool)
    assert isinstance(mamba2_ssd.cuda_available(), bool)
    assert issubclass(mamba2_ssd.InvalidArgumentError, ValueError)
    assert issubclass(mamba2_ssd.UnsupportedError, NotImplementedError)
    assert issubclass(mamba2_ssd.CudaError, RuntimeError)


# ---------------------------------------------------------------- errors


@pytest.fixture
def args():
    rng = np.random.default_rng(7)
    x, dt, A, B, C = make_batched(rng)
    return dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=16, out=np.empty_like(x))


def test_error_rank_carries_cpp_message(args):
    args["x"] = args["x"][0]
    with pytest.raises(ValueError) as ei:
        mamba2_ssd.forward_dlpack(**args)
    assert str(ei.value) == ("x: expected rank 4 (batch, seqlen, nheads, headdim) for the batched layout, "
                             "got rank 3 with shape (37, 4, 8)")
    assert isinstance(ei.value, mamba2_ssd.InvalidArgumentError)
    assert ei.value.argument == "x"


def test_error_dtype_mismatch(args):
    args["B"] = args["B"].astype(np.float16)
    with pytest.raises(ValueError, match=r"^B: expected dtype float32 \(the dtype of x\), got float16$"):
        mamba2_ssd.forward_dlpack(**args)


def test_error_unsupported_dtype(args):
    args["A"] = args["A"].astype(np.float64)
    with pytest.raises(ValueError, match=r"^A: unsupported dtype float64"):
        mamba2_ssd.forward_dlpack(**args)


def test_error_shape(args):
    args["dt"] = args["dt"][:, :-1]
    with pytest.raises(ValueError, match=r"^dt: expected shape \(2, 37, 4\) \(batch, seqlen, nheads\)"):
        mamba2_ssd.forward_dlpack(**args)


def test_error_inner_stride(args):
    x = np.repeat(args["x"], 2, axis=-1)[..., ::2]
    args["x"] = x
    with pytest.raises(ValueError, match=r"^x: expected a contiguous innermost dimension \(stride 1\), got stride 2"):
        mamba2_ssd.forward_dlpack(**args)


def test_error_cu_seqlens_contents(args):
    for k in ("x", "dt", "B", "C", "out"):
        args[k] = args[k][:1]
    h, p, n = args["x"].shape[2], args["x"].shape[3], args["B"].shape[3]
    cu = np.array([0, 20, 10, 37], np.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected non-decreasing values"):
        mamba2_ssd.forward_dlpack(**args, cu_seqlens=cu, varlen_states=np.empty((3, h, p, n), np.float32))


def test_error_varlen_needs_cu_seqlens(args):
    for k in ("x", "dt", "B", "C", "out"):
        args[k] = args[k][0]
    with pytest.raises(ValueError, match=r"^cu_seqlens: required for the varlen layout"):
        mamba2_ssd.forward_dlpack(**args, layout="varlen")


def test_error_dt_limit(args):
    with pytest.raises(ValueError, match=r"^dt_min: expected dt_min <= dt_max"):
        mamba2_ssd.forward_dlpack(**args, dt_limit=(1.0, 0.5))


def test_error_state_dtype(args):
    with pytest.raises(ValueError, match=r"^state_dtype: expected float32 or bfloat16"):
        mamba2_ssd.forward_dlpack(**args, state_dtype="float16")  # fp32 inputs: bf16 is the compute type
    with pytest.raises(ValueError, match=r"^state_dtype: expected None, float32"):
        mamba2_ssd.forward_dlpack(**args, state_dtype="int8")
    mamba2_ssd.forward_dlpack(**args, state_dtype=np.float32)
    mamba2_ssd.forward_dlpack(**args, state_dtype="bfloat16")


def test_error_python_types(args):
    with pytest.raises(TypeError, match=r"^x: expected an array supporting DLPack"):
        mamba2_ssd.forward_dlpack(**{**args, "x": [[1.0]]})
    with pytest.raises(TypeError, match=r"^D: expected an array supporting DLPack"):
        mamba2_ssd.forward_dlpack(**args, D="nope")
    with pytest.raises(TypeError, match=r"^dt: expected an array supporting DLPack, got None"):
        mamba2_ssd.forward_dlpack(**{**args, "dt": None})
    with pytest.raises(TypeError, match=r"^chunk_size: expected an int"):
        mamba2_ssd.forward_dlpack(**{**args, "chunk_size": 16.0})
    with pytest.raises(TypeError, match=r"^dt_softplus: expected a bool"):
        mamba2_ssd.forward_dlpack(**args, dt_softplus=1)
    with pytest.raises(TypeError, match=r"^dt_limit: expected a pair"):
        mamba2_ssd.forward_dlpack(**args, dt_limit=0.5)
    with pytest.raises(TypeError, match=r"^stream: expected"):
        mamba2_ssd.forward_dlpack(**args, stream="default")
    with pytest.raises(TypeError, match=r"^layout: expected"):
        mamba2_ssd.forward_dlpack(**args, layout=1)
    with pytest.raises(ValueError, match=r"^layout: expected"):
        mamba2_ssd.forward_dlpack(**args, layout="packed")
    with pytest.raises(TypeError):
        mamba2_ssd.forward_dlpack(args["x"])  # keyword-only


def test_error_read_only_output(args):
    args["out"].flags.writeable = False
    with pytest.raises(TypeError, match=r"^out: expected a writable"):
        mamba2_ssd.forward_dlpack(**args)


def test_error_chunk_size(args):
    with pytest.raises(ValueError, match=r"^chunk_size: expected chunk_size >= 1, got 0"):
        mamba2_ssd.forward_dlpack(**{**args, "chunk_size": 0})


@pytest.mark.skipif(mamba2_ssd.WITH_CUDA, reason="checks the CPU-only build's refusal of CUDA work")
def test_cpu_only_build_has_no_cuda():
    assert not mamba2_ssd.cuda_available()


def test_large_dt_softplus_identity():
    """softplus is the identity above 20 (as mamba_ssm)."""
    rng = np.random.default_rng(8)
    x, dt, A, B, C = make_batched(rng, b=1, l=8)
    dt = np.full_like(dt, 25.0)
    A = np.full_like(A, -0.01)
    out, final, _ = run_batched(x, dt, A, B, C, 8, dt_softplus=True)
    ref_out, ref_final, _, _ = scan_batched(x, dt, A, B, C, dt_softplus=True)
    assert rel_l2(out, ref_out) < TOL32
    assert math.isfinite(float(np.abs(final).max()))
