"""Float64 references for the benchmark's error column (docs/SEMANTICS.md, written out here).

- `chunked_f64`: the chunked algorithm in float64 with torch, on whatever device the inputs are
  on (the benchmark runs it on the GPU). Heads are processed in blocks so that the largest
  temporaries (the (batch, chunks, heads, Q, Q) decay matrix and the (batch, chunks, heads,
  headdim, dstate) chunk states) stay under `max_block_bytes`.
- `naive_recurrence_np`: the token-by-token recurrence in numpy float64, the oracle that
  `chunked_f64` is checked against on tiny shapes (bench/tests).

seq_idx / cu_seqlens are not supported (the benchmark does not use them).
"""
from __future__ import annotations

import math


def _process_dt_torch(torch, dt, dt_bias, dt_softplus, dt_limit):
    v = dt.to(torch.float64)
    if dt_bias is not None:
        v = v + dt_bias.to(torch.float64)
    if dt_softplus:
        v = torch.where(v <= 20.0, torch.log1p(torch.exp(torch.clamp(v, max=20.0))), v)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    return torch.clamp(v, min=lo, max=hi)


def chunked_f64(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), max_block_bytes=1 << 30):
    """Returns (out, final_states), both float64, out (b, l, h, p), final (b, h, p, n).

    Shapes as mamba_chunk_scan_combined: x, z (b, l, h, p); dt (b, l, h); A, dt_bias (h);
    B, C (b, l, g, n); D (h) or (h, p); initial_states (b, h, p, n).
    """
    import torch

    f64 = torch.float64
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if h % g:
        raise ValueError("nheads must be a multiple of ngroups")
    hpg = h // g
    Q = int(chunk_size)
    c = (l + Q - 1) // Q
    pad = c * Q - l
    dev = x.device

    dtp = _process_dt_torch(torch, dt, dt_bias, dt_softplus, dt_limit)     # (b, l, h)
    Af = A.to(f64)

    def padded(t):
        if pad == 0:
            return t
        shape = list(t.shape)
        shape[1] = pad
        return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=1)

    # dt' = 0 on padding: a = 0 there, so cum stays flat and padding adds nothing.
    dtp = padded(dtp).view(b, c, Q, h)
    Bc = padded(B.to(f64)).view(b, c, Q, g, n)
    Cc = padded(C.to(f64)).view(b, c, Q, g, n)
    a = dtp * Af                                              # (b, c, Q, h)
    cum = torch.cumsum(a, dim=2)                              # (b, c, Q, h)
    cum_last = cum[:, :, -1, :]                               # (b, c, h)
    causal = torch.ones(Q, Q, dtype=torch.bool, device=dev).tril()   # [t, s]: s <= t

    # CB per group: (b, c, g, Q_t, Q_s)
    CB = torch.einsum("bctgn,bcsgn->bcgts", Cc, Bc)

    out = torch.empty(b, l, h, p, dtype=f64, device=dev)
    final = torch.empty(b, h, p, n, dtype=f64, device=dev)

    per_head = max(b * c * Q * Q, b * c * p * n, b * c * Q * p * 2, b * c * Q * n) * 8
    hb = max(1, min(h, int(max_block_bytes // max(per_head, 1))))

    for h0 in range(0, h, hb):
        h1 = min(h, h0 + hb)
        hs = slice(h0, h1)
        heads = torch.arange(h0, h1, device=dev)
        grp = heads // hpg                                     # group of each head
        xb = padded(x[:, :, hs].to(f64)).view(b, c, Q, h1 - h0, p)
        cumb = cum[..., hs]                                    # (b, c, Q, hb)
        dtb = dtp[..., hs]
        # intra: decay[t, s] = exp(min(cum_t - cum_s, 0)) for s <= t
        diff = cumb.permute(0, 1, 3, 2).unsqueeze(-1) - cumb.permute(0, 1, 3, 2).unsqueeze(-2)
        decay = torch.exp(torch.clamp(diff, max=0.0)) * causal  # (b, c, hb, Q_t, Q_s)
        M = CB[:, :, grp] * decay * dtb.permute(0, 1, 3, 2).unsqueeze(-2)
        del diff, decay
        y = torch.einsum("bchts,bcshp->bcthp", M, xb)         # (b, c, Q, hb, p)
        del M
        # chunk-local states: sum_s exp(min(cum_last - cum_s, 0)) dt'_s x_s B_s^T
        w = torch.exp(torch.clamp(cum_last[..., hs].unsqueeze(2) - cumb, max=0.0)) * dtb  # (b,c,Q,hb)
        Bh = Bc[:, :, :, grp]                                  # (b, c, Q, hb, n)
        wx = w.unsqueeze(-1) * xb                              # (b, c, Q, hb, p)
        S = torch.einsum("bcshp,bcshn->bchpn", wx, Bh)         # (b, c, hb, p, n)
        del w, wx, Bh
        # state passing: H_in[k] = state entering chunk k
        if initial_states is not None:
            H = initial_states[:, hs].to(f64).clone()
        else:
            H = torch.zeros(b, h1 - h0, p, n, dtype=f64, device=dev)
        decay_chunk = torch.exp(cum_last[..., hs])             # (b, c, hb)
        Hin = torch.empty(b, c, h1 - h0, p, n, dtype=f64, device=dev)
        for k in range(c):
            Hin[:, k] = H
            H = decay_chunk[:, k, :, None, None] * H + S[:, k]
        final[:, hs] = H
        del S
        # inter: exp(cum_t) * (H_in C_t)
        Ch = Cc[:, :, :, grp]                                  # (b, c, Q, hb, n)
        y = y + torch.exp(cumb).unsqueeze(-1) * torch.einsum("bcthn,bchpn->bcthp", Ch, Hin)
        del Ch, Hin
        y = y.reshape(b, c * Q, h1 - h0, p)[:, :l]
        xo = x[:, :, hs].to(f64)
        if D is not None:
            Dd = D[hs].to(f64)
            y = y + (Dd.view(1, 1, -1, 1) if Dd.dim() == 1 else Dd.unsqueeze(0).unsqueeze(0)) * xo
        if z is not None:
            zz = z[:, :, hs].to(f64)
            y = y * zz * torch.sigmoid(zz)
        out[:, :, hs] = y
    return out, final


def rel_l2(torch, got, ref):
    """||got - ref|| / ||ref|| in float64 (nan if got has non-finite values)."""
    d = got.to(torch.float64) - ref
    num = torch.linalg.vector_norm(d).item()
    den = torch.linalg.vector_norm(ref).item()
    if not math.isfinite(num):
        return float("nan")
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def naive_recurrence_np(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None,
                        dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """Token-by-token oracle, numpy float64 (inputs: numpy arrays of any float type)."""
    import numpy as np

    x = np.asarray(x, np.float64)
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    hpg = h // g
    v = np.asarray(dt, np.float64)
    if dt_bias is not None:
        v = v + np.asarray(dt_bias, np.float64)
    if dt_softplus:
        v = np.where(v <= 20.0, np.log1p(np.exp(np.minimum(v, 20.0))), v)
    v = np.clip(v, dt_limit[0], dt_limit[1])
    A = np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)
    C = np.asarray(C, np.float64)
    out = np.zeros((b, l, h, p))
    final = np.zeros((b, h, p, n))
    for bi in range(b):
        for hi in range(h):
            gi = hi // hpg
            H = (np.asarray(initial_states[bi, hi], np.float64).copy()
                 if initial_states is not None else np.zeros((p, n)))
            for t in range(l):
                H = math.exp(A[hi] * v[bi, t, hi]) * H + v[bi, t, hi] * np.outer(x[bi, t, hi], B[bi, t, gi])
                y = H @ C[bi, t, gi]
                if D is not None:
                    Dh = np.asarray(D, np.float64)[hi]
                    y = y + Dh * x[bi, t, hi]
                if z is not None:
                    zz = np.asarray(z, np.float64)[bi, t, hi]
                    y = y * zz / (1.0 + np.exp(-zz))
                out[bi, t, hi] = y
            final[bi, hi] = H
    return out, final
