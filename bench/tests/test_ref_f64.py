"""CPU checks of the float64 chunked reference against the token-by-token oracle."""
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ref_f64  # noqa: E402

torch = pytest.importorskip("torch")


def _inputs(rng, b, l, h, g, p, n, *, D_hdim=False, z=True, bias=True, init=True):
    t = lambda *s: torch.from_numpy(rng.standard_normal(s))
    x = t(b, l, h, p)
    dt = torch.from_numpy(rng.uniform(-3.0, 1.0, (b, l, h)))
    A = -torch.from_numpy(rng.uniform(0.5, 4.0, (h,)))
    B = t(b, l, g, n)
    C = t(b, l, g, n)
    D = t(h, p) if D_hdim else t(h)
    zz = t(b, l, h, p) if z else None
    dt_bias = t(h) * 0.5 if bias else None
    init_s = t(b, h, p, n) if init else None
    return x, dt, A, B, C, D, zz, dt_bias, init_s


@pytest.mark.parametrize("case", [
    dict(b=2, l=37, h=4, g=2, p=3, n=5, Q=8, D_hdim=True, z=True, bias=True, init=True, sp=True,
         lim=(0.0, float("inf"))),
    dict(b=1, l=64, h=3, g=1, p=4, n=6, Q=16, D_hdim=False, z=False, bias=False, init=False, sp=False,
         lim=(0.0, float("inf"))),
    dict(b=2, l=23, h=2, g=2, p=2, n=3, Q=32, D_hdim=False, z=True, bias=True, init=True, sp=True,
         lim=(0.05, 0.7)),
    dict(b=1, l=9, h=4, g=1, p=2, n=2, Q=4, D_hdim=True, z=False, bias=True, init=True, sp=False,
         lim=(0.0, 2.0)),
])
def test_chunked_matches_recurrence(case):
    rng = np.random.default_rng(1234)
    x, dt, A, B, C, D, z, dt_bias, init = _inputs(
        rng, case["b"], case["l"], case["h"], case["g"], case["p"], case["n"],
        D_hdim=case["D_hdim"], z=case["z"], bias=case["bias"], init=case["init"])
    if not case["sp"]:
        dt = dt.abs() * 0.3  # positive dt without softplus
    kw = dict(D=D, z=z, dt_bias=dt_bias, initial_states=init, dt_softplus=case["sp"], dt_limit=case["lim"])
    out, fin = ref_f64.chunked_f64(x, dt, A, B, C, case["Q"], max_block_bytes=1 << 12, **kw)
    np_kw = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in kw.items()}
    ro, rf = ref_f64.naive_recurrence_np(x.numpy(), dt.numpy(), A.numpy(), B.numpy(), C.numpy(), **np_kw)
    assert np.abs(out.numpy() - ro).max() <= 1e-10 * max(1.0, np.abs(ro).max())
    assert np.abs(fin.numpy() - rf).max() <= 1e-10 * max(1.0, np.abs(rf).max())


def test_head_blocks_do_not_change_result():
    rng = np.random.default_rng(7)
    x, dt, A, B, C, D, z, dt_bias, init = _inputs(rng, 2, 50, 6, 3, 4, 5)
    kw = dict(D=D, z=z, dt_bias=dt_bias, initial_states=init, dt_softplus=True)
    o1, f1 = ref_f64.chunked_f64(x, dt, A, B, C, 16, max_block_bytes=1, **kw)
    o2, f2 = ref_f64.chunked_f64(x, dt, A, B, C, 16, max_block_bytes=1 << 40, **kw)
    assert torch.allclose(o1, o2, rtol=1e-12, atol=1e-12) and torch.allclose(f1, f2, rtol=1e-12, atol=1e-12)


def test_rel_l2():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert ref_f64.rel_l2(torch, torch.tensor([3.0, 4.0]), ref) == 0.0
    assert abs(ref_f64.rel_l2(torch, torch.tensor([3.0, 9.0]), ref) - 1.0) < 1e-12
    assert math.isnan(ref_f64.rel_l2(torch, torch.tensor([float("nan"), 4.0]), ref))
