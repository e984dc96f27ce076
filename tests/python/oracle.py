"""An independent float64 token-by-token oracle of the SSD forward (numpy only).

Follows docs/SEMANTICS.md's token recurrence, not the chunked algorithm the library runs:

    dt'_t = clamp(softplus?(dt_t + dt_bias), dt_min, dt_max)
    H_t   = [seq_idx[t] == seq_idx[t-1]] * exp(A * dt'_t) * H_{t-1} + dt'_t * x_t (outer) B_t
    y_t   = H_t C_t,   out_t = (y_t + D * x_t) * silu(z_t)

with H_{-1} the initial state (zero when absent) and seq_idx[-1] = 0.
"""
import numpy as np


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _dt_eff(dt, dt_bias, dt_softplus, dt_limit):
    v = dt + (0.0 if dt_bias is None else dt_bias)
    if dt_softplus:
        v = np.where(v <= 20.0, np.log1p(np.exp(np.minimum(v, 20.0))), v)
    return np.minimum(np.maximum(v, dt_limit[0]), dt_limit[1])


def scan_row(x, dt, A, B, C, D=None, z=None, dt_bias=None, h0=None, seq_idx=None, dt_softplus=False,
             dt_limit=(0.0, np.inf)):
    """One row: x (l, h, p), dt (l, h), B/C (l, g, n), seq_idx (l,) or None, h0 (h, p, n).
    Returns out (l, h, p) and every state after each token, states (l, h, p, n)."""
    x, dt, A, B, C, D, z, dt_bias, h0 = map(_f64, (x, dt, A, B, C, D, z, dt_bias, h0))
    L, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    rep = H // G
    Bh = np.repeat(B, rep, axis=1)  # (l, h, n)
    Ch = np.repeat(C, rep, axis=1)
    dte = _dt_eff(dt, dt_bias, dt_softplus, dt_limit)  # (l, h)
    state = np.zeros((H, P, N)) if h0 is None else h0.copy()
    prev_seq = 0
    out = np.zeros((L, H, P))
    states = np.zeros((L, H, P, N))
    for t in range(L):
        keep = 1.0
        if seq_idx is not None:
            keep = 1.0 if int(seq_idx[t]) == prev_seq else 0.0
            prev_seq = int(seq_idx[t])
        decay = np.exp(A * dte[t])[:, None, None]  # (h, 1, 1)
        state = keep * decay * state + dte[t][:, None, None] * x[t][:, :, None] * Bh[t][:, None, :]
        states[t] = state
        y = np.einsum("hpn,hn->hp", state, Ch[t])
        if D is not None:
            y = y + (D[:, None] if D.ndim == 1 else D) * x[t]
        if z is not None:
            zt = z[t]
            y = y * (zt / (1.0 + np.exp(-zt)))
        out[t] = y
    return out, states


def scan_batched(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, initial_states=None,
                 seq_idx=None, dt_softplus=False, dt_limit=(0.0, np.inf)):
    """Batched layout. Returns (out (b,l,h,p), final_states (b,h,p,n), chunk_states
    (b,c,h,p,n) or None when chunk_size is None, states (b,l,h,p,n))."""
    b, L = x.shape[0], x.shape[1]
    outs, finals, chunks, all_states = [], [], [], []
    for i in range(b):
        o, st = scan_row(x[i], dt[i], A, B[i], C[i], D, None if z is None else z[i], dt_bias,
                         None if initial_states is None else initial_states[i],
                         None if seq_idx is None else seq_idx[i], dt_softplus, dt_limit)
        outs.append(o)
        finals.append(st[-1])
        all_states.append(st)
        if chunk_size is not None:
            lasts = [min(k + chunk_size, L) - 1 for k in range(0, L, chunk_size)]
            chunks.append(st[lasts])
    return (np.stack(outs), np.stack(finals), np.stack(chunks) if chunk_size is not None else None,
            np.stack(all_states))


def scan_varlen(x, dt, A, B, C, cu_seqlens, chunk_size=None, D=None, z=None, dt_bias=None,
                initial_states=None, dt_softplus=False, dt_limit=(0.0, np.inf)):
    """Varlen layout: x (T,h,p) etc. Returns (out (T,h,p), final_states (S,h,p,n), list of per
    sequence chunk states [(c_i, h, p, n)])."""
    cu = [int(v) for v in cu_seqlens]
    S = len(cu) - 1
    T, H, P = x.shape
    N = B.shape[2]
    out = np.zeros((T, H, P))
    finals = np.zeros((S, H, P, N))
    chunks = []
    for i in range(S):
        s, e = cu[i], cu[i + 1]
        h0 = None if initial_states is None else np.asarray(initial_states[i], dtype=np.float64)
        if e == s:
            finals[i] = 0.0 if h0 is None else h0
            chunks.append(np.zeros((0, H, P, N)))
            continue
        o, st = scan_row(x[s:e], dt[s:e], A, B[s:e], C[s:e], D, None if z is None else z[s:e], dt_bias, h0,
                         None, dt_softplus, dt_limit)
        out[s:e] = o
        finals[i] = st[-1]
        if chunk_size is not None:
            n = e - s
            lasts = [min(k + chunk_size, n) - 1 for k in range(0, n, chunk_size)]
            chunks.append(st[lasts])
    return out, finals, chunks


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = np.linalg.norm(b.ravel())
    return float(np.linalg.norm((a - b).ravel()) / (den if den > 0 else 1.0))
