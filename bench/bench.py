#!/usr/bin/env python3
"""Side-by-side benchmark: mamba2_ssd's forward against mamba_ssm 2.3.2.post1's Triton
`mamba_chunk_scan_combined`, on identical inputs, on one GPU.

Per shape it measures, for each implementation:
  - GPU time: median over CUDA graph replays of one graph that calls the implementation once on
    each of several input sets in turn (enough sets that together they exceed the L2 several
    times over), divided by the number of sets: per-call device time without launch gaps and
    without an L2-resident working set;
  - eager time: median over batches of back-to-back calls from Python with
    torch.cuda.synchronize() around each batch (what a user without graphs sees per call);
  - the first call's wall time (compilation; Triton's autotuning runs before each sweep);
  - the relative L2 error of `out` and of the final states against a float64 implementation of
    the chunked algorithm (bench/ref_f64.py) on the same inputs, where that is affordable;
and the roofline floor of the shape (bench/roofline.py) from ceilings measured in the same run:
device copy bandwidth (a 1 GiB torch copy, bytes read + written) and the bf16 GEMM rate
(torch.matmul 8192^3 on random data).

Repeat counts are time-budgeted (--budget-s per measurement). A shape that fails (an exception
in either implementation, out of memory, a graph that cannot be captured) is recorded with its
error and the sweep goes on. Results are written after every shape (--out DIR): results.json,
results.csv, anchor.png, and with --breakdown breakdown.csv; bench/make_report.py turns the JSON
into docs/PERFORMANCE.md.

Examples (repo root, package installed, mamba_ssm source in .deps/ via scripts/fetch-deps.sh --bench):
  python3 bench/bench.py --sweep anchor,models --out out/bench
  python3 bench/bench.py --shape 4,16384,8,1,64,128,128 --breakdown
  python3 bench/bench.py --sweep anchor --quick
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, asdict

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import roofline  # noqa: E402
import results_io as rio  # noqa: E402

K = 1024


# ============================================================== shapes

@dataclass
class Case:
    sweep: str
    b: int
    l: int
    h: int
    g: int
    p: int
    n: int
    q: int
    name: str = ""
    dtype: str = "bf16"
    D: str = "head"            # none | head | headdim
    z: bool = False
    dt_bias: bool = False
    softplus: bool = False
    init: bool = True
    final: bool = True

    def options(self):
        return {"D": self.D, "z": self.z, "dt_bias": self.dt_bias, "softplus": self.softplus,
                "init": self.init, "final": self.final}

    def label(self):
        return self.name or rio.shape_label(asdict(self))


ANCHOR_DSTATES = (64, 128, 256, 512)
ANCHOR_SEQLENS = (1 * K, 4 * K, 16 * K, 64 * K, 256 * K)
ANCHOR_SEQLENS_QUICK = (1 * K, 16 * K, 64 * K)


def anchor_case(l, n, sweep="anchor"):
    """batch 4, 8 heads, 1 group, headdim 64, chunk 128, bf16, D per head, initial and final states."""
    return Case(sweep, 4, l, 8, 1, 64, n, 128, name=f"n{n} l{rio.seqlen_label(l)}",
                D="head", init=True, final=True)


def model_case(b, l, h=80, g=1, p=64, n=128, q=256, tag="2.7B", sweep="models"):
    """A Mamba-2 layer's call (mamba_ssm.modules.mamba2.Mamba2 with rmsnorm, training path): D per
    head, dt_bias + softplus, z=None, no initial states, no final states."""
    return Case(sweep, b, l, h, g, p, n, q, name=f"{tag} {b}x{rio.seqlen_label(l)}",
                D="head", z=False, dt_bias=True, softplus=True, init=False, final=False)


def build_sweep(name, quick=False):
    if name == "anchor":
        seqlens = ANCHOR_SEQLENS_QUICK if quick else ANCHOR_SEQLENS
        # dstate outermost (Triton's autotuning per dstate runs before the sweep's cases: tune_triton)
        return [anchor_case(l, n) for n in ANCHOR_DSTATES for l in seqlens]
    if name == "models":
        cs = [model_case(1, 2 * K), model_case(1, 8 * K), model_case(4, 8 * K), model_case(1, 64 * K),
              model_case(8, 4 * K)]
        # 8 groups, dstate 64: 64 heads of headdim 64 (d_inner 4096), chunk 256.
        cs.append(model_case(8, 4 * K, h=64, g=8, p=64, n=64, q=256, tag="8-group n64"))
        return cs
    if name == "tp":
        # The 2.7B layer split over 8 or 4 GPUs by heads (tensor parallel), one long sequence:
        # few walks (batch x heads), where fwd_pass_state's chain is the cost.
        return [model_case(1, l, h=h, tag=f"2.7B/{80 // h}", sweep="tp") for h in (10, 20) for l in (16 * K, 64 * K)]
    raise ValueError(f"unknown sweep {name!r} (anchor, models, tp)")


def parse_shape(s: str):
    parts = [p.strip() for p in s.replace("x", ",").split(",") if p.strip()]
    if len(parts) != 7:
        raise argparse.ArgumentTypeError(f"--shape wants b,l,h,g,p,n,q (7 integers), got {s!r}")
    try:
        vals = [int(v[:-1]) * K if v[-1:] in ("k", "K") else int(v) for v in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape wants integers (1K suffix allowed), got {s!r}")
    b, l, h, g, p, n, q = vals
    if min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"--shape values must be positive, got {s!r}")
    if h % g:
        raise argparse.ArgumentTypeError(f"--shape: heads ({h}) must be a multiple of groups ({g})")
    return tuple(vals)


def shape_case(vals, preset, sweep="shape"):
    b, l, h, g, p, n, q = vals
    if preset == "model":
        c = model_case(b, l, h=h, g=g, p=p, n=n, q=q, tag="shape", sweep=sweep)
    else:
        c = anchor_case(l, n, sweep=sweep)
        c.b, c.h, c.g, c.p, c.q = b, h, g, p, q
    c.name = rio.shape_label(asdict(c))
    return c


# ============================================================== helpers

def log(msg=""):
    print(msg, flush=True)


def short_exc(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    # Keep the message and the innermost frames: enough to find the cause, short enough for JSON.
    text = "".join(tb[-4:]).strip()
    return text[-2000:]


def median(xs):
    return statistics.median(xs) if xs else None


def pct(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    i = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[i]


class Ctx:
    """Everything a measurement needs: torch, the device, the two functions, the ceilings."""

    def __init__(self, args, torch):
        self.args = args
        self.torch = torch
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.fns = {}
        self.fn_errors = {}
        self.triton_mod = None
        self.copy_gbps = None
        self.gemm_tflops = None
        self.dead = None            # set to a message once the CUDA context is unusable
        self.t_start = time.perf_counter()
        self.ours_accepts_out = True
        self.clocks = None          # gpu_clocks.ClockSampler while the run lasts (CUDA only)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def elapsed(self):
        return time.perf_counter() - self.t_start

    def over_time(self):
        lim = self.args.time_limit_s
        return lim and lim > 0 and self.elapsed() > lim

    def alive(self):
        if not self.cuda:
            return True
        try:
            self.torch.cuda.synchronize()
            t = self.torch.ones(4, device=self.dev)
            return float((t + 1).sum().item()) == 8.0
        except Exception:
            return False

    def free(self):
        gc.collect()
        if self.cuda:
            try:
                self.torch.cuda.synchronize()
                self.torch.cuda.empty_cache()
            except Exception:
                pass


DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def tdtype(torch, name):
    return getattr(torch, DTYPES[name])


# ============================================================== inputs

class Inputs:
    """One input set (the per-call tensors) of a case."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def make_weights(ctx, case, gen):
    torch, dev = ctx.torch, ctx.dev
    h, p = case.h, case.p
    A = -torch.exp(torch.empty(h, device=dev).uniform_(math.log(1.0), math.log(16.0), generator=gen))
    D = None
    if case.D == "head":
        D = torch.randn(h, device=dev, generator=gen)
    elif case.D == "headdim":
        D = torch.randn(h, p, device=dev, generator=gen)
    dt_bias = None
    if case.dt_bias:
        # mamba_ssm's init: dt = exp(U(log 1e-3, log 1e-1)), dt_bias = inverse softplus of dt.
        dt0 = torch.exp(torch.empty(h, device=dev).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
        dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    return Inputs(A=A, D=D, dt_bias=dt_bias)


def make_set(ctx, case, gen):
    torch, dev = ctx.torch, ctx.dev
    dt_ = tdtype(torch, case.dtype)
    b, l, h, g, p, n = case.b, case.l, case.h, case.g, case.p, case.n
    x = torch.randn(b, l, h, p, device=dev, dtype=dt_, generator=gen)
    B = torch.randn(b, l, g, n, device=dev, dtype=dt_, generator=gen)
    C = torch.randn(b, l, g, n, device=dev, dtype=dt_, generator=gen)
    if case.softplus:
        dt = (0.5 * torch.randn(b, l, h, device=dev, generator=gen)).to(dt_)   # pre-activation
    else:
        dt = torch.exp(torch.empty(b, l, h, device=dev).uniform_(math.log(1e-3), math.log(1e-1),
                                                                  generator=gen)).to(dt_)
    z = torch.randn(b, l, h, p, device=dev, dtype=dt_, generator=gen) if case.z else None
    init = torch.randn(b, h, p, n, device=dev, generator=gen) if case.init else None
    return Inputs(x=x, dt=dt, B=B, C=C, z=z, init=init)


def problem_of(case, torch):
    es = torch.empty(0, dtype=tdtype(torch, case.dtype)).element_size()
    return roofline.Problem(case.b, case.l, case.h, case.g, case.p, case.n, case.q, es=es, es_dt=es,
                            has_z=case.z, D=case.D, has_bias=case.dt_bias,
                            es_init=4 if case.init else 0, es_final=4 if case.final else 0)


def call_kwargs(ctx, impl, case, s, w):
    """Keyword arguments of one call (the options of the case; ours also gets --state-dtype)."""
    kw = dict(D=w.D, z=s.z, dt_bias=w.dt_bias, initial_states=s.init, dt_softplus=case.softplus,
              return_final_states=case.final)
    if impl == "ours" and ctx.args.state_dtype != "auto":
        kw["state_dtype"] = tdtype(ctx.torch, ctx.args.state_dtype)
    return kw


def call_impl(ctx, impl, case, s, w, out=None):
    """One forward call. Returns (out, final_states or None)."""
    fn = ctx.fns[impl]
    kw = call_kwargs(ctx, impl, case, s, w)
    if impl == "ours" and out is not None:
        kw["out"] = out
    r = fn(s.x, s.dt, w.A, s.B, s.C, case.q, **kw)
    if case.final:
        return r[0], r[1]
    if isinstance(r, (tuple, list)):
        return r[0], None
    return r, None


def tune_ours(ctx, case, s, w):
    """mamba2_ssd.tune() on one input set (fills the tuning cache for this shape class)."""
    import importlib

    mod = importlib.import_module(ctx.args.ours_module)
    kw = call_kwargs(ctx, "ours", case, s, w)
    return mod.tune(s.x, s.dt, w.A, s.B, s.C, case.q, budget_seconds=ctx.args.tune_budget_s, **kw)


# ============================================================== timing

def graph_time(ctx, run_all, nsets, budget_s):
    """Median per-call device time (ms) over replays of one graph that runs all input sets."""
    torch = ctx.torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_all()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            run_all()
        g.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        one = max(e0.elapsed_time(e1), 1e-4)
        reps = int(min(ctx.args.max_reps, max(ctx.args.min_reps, budget_s * 1e3 / one)))
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        t0 = time.monotonic()
        for a, b in evs:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        t1 = time.monotonic()
        times = [a.elapsed_time(b) / nsets for a, b in evs]
    finally:
        del g
    d = {"graph_ms": median(times), "graph_ms_p10": pct(times, 0.1), "graph_ms_p90": pct(times, 0.9),
         "graph_reps": len(times)}
    clocks = ctx.clocks.window(t0, t1) if ctx.clocks is not None else None
    if clocks:
        d.update(clocks)  # sm_mhz, sm_mhz_min, power_w, power_capped, clock_samples
    return d


def host_time(ctx, call_i, nsets, budget_s, key):
    """Median per-call wall time (ms) over batches of back-to-back calls, synchronized around each
    batch. On the CPU (testing) this is also what stands in for the graph time."""
    ctx.sync()
    t0 = time.perf_counter()
    for i in range(nsets):
        call_i(i)
    ctx.sync()
    est = max((time.perf_counter() - t0) / nsets, 1e-6)
    batch = int(min(2000, max(nsets, math.ceil(0.005 / est))))
    nb = int(min(ctx.args.max_reps, max(ctx.args.min_reps, budget_s / (batch * est))))
    times = []
    for _ in range(nb):
        ctx.sync()
        t0 = time.perf_counter()
        for j in range(batch):
            call_i(j % nsets)
        ctx.sync()
        times.append((time.perf_counter() - t0) / batch * 1e3)
    return {key: median(times), key + "_p10": pct(times, 0.1), key + "_p90": pct(times, 0.9),
            key.replace("_ms", "_calls"): nb * batch}


COPY_BYTES = 1 << 30   # source size of the copy ceiling (it moves twice that)
GEMM_N = 8192          # n of the n^3 bf16 GEMM ceiling


def measure_ceilings(ctx):
    """Device copy bandwidth (GB/s, read + written bytes) and bf16 GEMM rate (TFLOP/s)."""
    torch = ctx.torch
    res = {}
    nbytes = COPY_BYTES
    src = torch.empty(nbytes // 4, device=ctx.dev, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
    for a, b in evs:
        a.record()
        dst.copy_(src)
        b.record()
    torch.cuda.synchronize()
    t = median([a.elapsed_time(b) for a, b in evs])
    res["copy_gbps"] = 2 * nbytes / (t * 1e-3) / 1e9
    res["copy_bytes"] = 2 * nbytes
    del src, dst
    m = GEMM_N
    a_ = torch.randn(m, m, device=ctx.dev, dtype=torch.bfloat16)
    b_ = torch.randn(m, m, device=ctx.dev, dtype=torch.bfloat16)
    for _ in range(3):
        c_ = a_ @ b_
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
    for a, b in evs:
        a.record()
        c_ = a_ @ b_
        b.record()
    torch.cuda.synchronize()
    t = median([a.elapsed_time(b) for a, b in evs])
    res["bf16_gemm_tflops"] = 2 * m ** 3 / (t * 1e-3) / 1e12
    res["gemm_shape"] = [m, m, m]
    del a_, b_, c_
    # The host's speed, which the eager times follow (they are host-bound at short calls and vary
    # up to 2x between machines of one kind): a one-element in-place add, back to back.
    one = torch.zeros(1, device=ctx.dev)
    times = []
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            one.add_(1.0)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)  # us per call
    res["host_add_us"] = median(times)
    del one
    ctx.free()
    return res


# ============================================================== one shape

def f64_affordable(ctx, case):
    if ctx.args.no_f64:
        return False
    return case.b * case.l * case.h <= ctx.args.f64_max_tokheads


def run_case(ctx, case):
    torch = ctx.torch
    t_case = time.perf_counter()
    r = {"sweep": case.sweep, "name": case.label(), "b": case.b, "l": case.l, "h": case.h, "g": case.g,
         "p": case.p, "n": case.n, "q": case.q, "dtype": case.dtype, "options": case.options(),
         "status": "error", "note": None}
    pr = problem_of(case, torch)
    r["floor"] = roofline.problem_floor(pr, ctx.copy_gbps, ctx.gemm_tflops)
    set_bytes = roofline.io_bytes(pr)
    if ctx.cuda:
        nsets = int(min(ctx.args.max_sets, max(2, math.ceil(ctx.rotate_bytes / set_bytes))))
    else:
        nsets = 2
    r["nsets"] = nsets
    r["set_bytes"] = set_bytes
    impls = [i for i in ("ours", "triton") if i in ctx.fns]
    for i in ("ours", "triton"):
        r[i] = {}
        if i not in ctx.fns and i in ctx.fn_errors:
            r[i]["error"] = "not loaded: " + ctx.fn_errors[i]
    sets = w = None
    try:
        gen = torch.Generator(device=ctx.dev)
        gen.manual_seed(ctx.args.seed + hash((case.b, case.l, case.h, case.g, case.p, case.n, case.q)) % 100000)
        w = make_weights(ctx, case, gen)
        sets = [make_set(ctx, case, gen) for _ in range(nsets)]
        ctx.sync()
        first = {}
        # ---- tuning ahead of the first call (--tune): what `mamba2-ssd tune` does for a user
        if "ours" in impls and ctx.args.tune:
            try:
                tr = tune_ours(ctx, case, sets[0], w)
                r["ours"]["tune_s"] = tr["seconds"]
                r["ours"]["kernel_config"] = tr["best"]
                r["ours"]["tune_gain"] = tr["heuristic_ms"] / tr["best_ms"] if tr["best_ms"] > 0 else None
            except Exception as e:  # noqa: BLE001 - reported, the timing goes on untuned
                r["ours"]["tune_error"] = short_exc(e)
            ctx.sync()
        # ---- first call (compilation / autotuning) and outputs for the error check
        for impl in impls:
            d = r[impl]
            try:
                ctx.sync()
                t0 = time.perf_counter()
                o, f = call_impl(ctx, impl, case, sets[0], w)
                ctx.sync()
                d["first_call_s"] = time.perf_counter() - t0
                if impl == "ours" and ctx.ours_accepts_out:
                    # Poisoned output buffer: an element the kernels never write stays NaN.
                    poison = torch.full_like(sets[0].x, float("nan"))
                    try:
                        o2, f2 = call_impl(ctx, impl, case, sets[0], w, out=poison)
                        d["poisoned_out"] = True
                        # Same inputs twice: bitwise equal results, or a race to look for.
                        d["repeat_equal"] = bool(torch.equal(o, o2)) and (f is None or bool(torch.equal(f, f2)))
                        o, f = o2, f2
                    except TypeError:
                        ctx.ours_accepts_out = False
                    ctx.sync()
                first[impl] = (o, f)
            except Exception as e:
                d["error"] = short_exc(e)
                if not ctx.alive():
                    ctx.dead = f"CUDA context lost in {impl} on {case.label()}"
                    raise
        # ---- float64 error check
        if first and f64_affordable(ctx, case):
            try:
                import ref_f64
                s0 = sets[0]
                t0 = time.perf_counter()
                ro, rf = ref_f64.chunked_f64(s0.x, s0.dt, w.A, s0.B, s0.C, case.q, D=w.D, z=s0.z,
                                             dt_bias=w.dt_bias, initial_states=s0.init,
                                             dt_softplus=case.softplus, max_block_bytes=ctx.args.f64_block_bytes)
                for impl, (o, f) in first.items():
                    d = r[impl]
                    try:
                        d["err_out"] = ref_f64.rel_l2(torch, o, ro)
                        d["nonfinite_out"] = int((~torch.isfinite(o)).sum().item())
                        if case.final and f is not None:
                            d["err_final"] = ref_f64.rel_l2(torch, f, rf)
                    except Exception as e:
                        d["check_error"] = short_exc(e)
                r["f64_s"] = time.perf_counter() - t0
                del ro, rf
            except Exception as e:
                first_line = str(e).strip().splitlines()[0][:200] if str(e).strip() else repr(e)
                r["note"] = "float64 reference failed: " + first_line
        elif first:
            r["note"] = "no float64 check (tokens*heads over --f64-max-tokheads)"
        first.clear()
        ctx.free()
        # ---- timing
        for impl in impls:
            d = r[impl]
            if d.get("error"):
                continue

            def call_i(i, impl=impl):
                call_impl(ctx, impl, case, sets[i], w)

            def run_all(impl=impl):
                for i in range(nsets):
                    call_impl(ctx, impl, case, sets[i], w)

            try:
                run_all()   # every set once, outside any graph
                ctx.sync()
            except Exception as e:
                d["error"] = short_exc(e)
                if not ctx.alive():
                    ctx.dead = f"CUDA context lost in {impl} on {case.label()}"
                    raise
                continue
            budget = ctx.args.budget_s
            if ctx.cuda:
                try:
                    d.update(graph_time(ctx, run_all, nsets, budget))
                    d["graph_method"] = "cuda-graph"
                except Exception as e:
                    d["graph_error"] = short_exc(e)
                    if not ctx.alive():
                        ctx.dead = f"CUDA context lost while capturing {impl} on {case.label()}"
                        raise
                    ctx.free()
            else:
                d.update({k.replace("host", "graph"): v
                          for k, v in host_time(ctx, call_i, nsets, budget, "host_ms").items()})
                d["graph_method"] = "cpu-host-timer"
            if not ctx.args.no_eager:
                try:
                    d.update(host_time(ctx, call_i, nsets, budget, "eager_ms"))
                except Exception as e:
                    d["eager_error"] = short_exc(e)
                    if not ctx.alive():
                        ctx.dead = f"CUDA context lost in eager {impl} on {case.label()}"
                        raise
            if "graph_ms" not in d and "eager_ms" in d and ctx.cuda:
                r["note"] = ((r["note"] + "; ") if r["note"] else "") + \
                    f"{impl}: no graph time (see graph_error)"
        ok = all(r[i].get("graph_ms") is not None for i in impls) and len(impls) > 0
        r["status"] = "ok" if ok and not any(r[i].get("error") for i in ("ours", "triton")) else "error"
    except Exception as e:
        r["status"] = "error"
        msg = short_exc(e)
        r["note"] = ((r["note"] + "; ") if r["note"] else "") + msg.splitlines()[-1][:300]
        r["exception"] = msg
    finally:
        sets = w = None
        ctx.free()
    r["elapsed_s"] = time.perf_counter() - t_case
    rio.fill_derived(r)
    return r


def progress_line(i, total, r, t_total):
    o, t = r.get("ours") or {}, r.get("triton") or {}
    fl = r.get("floor") or {}
    f = rio.fmt_ms
    s = (f"[{i:>2}/{total} {r['sweep']}] {r['name']:<22} T {f(t.get('graph_ms')):>7} ms  ours "
         f"{f(o.get('graph_ms')):>7} ms  {rio.fmt_x(r.get('speedup')):>7} | eager T {f(t.get('eager_ms'))} "
         f"ours {f(o.get('eager_ms'))} | floor {f(fl.get('floor_ms'))} {(fl.get('bound') or '-')[:3]}: ours "
         f"{rio.fmt_pct(r.get('pct_floor_ours'))} T {rio.fmt_pct(r.get('pct_floor_triton'))} | err out "
         f"{rio.fmt_err(o.get('err_out'))}/{rio.fmt_err(t.get('err_out'))}")
    if r.get("options", {}).get("final"):
        s += f" fin {rio.fmt_err(o.get('err_final'))}/{rio.fmt_err(t.get('err_final'))}"
    s += (f" | 1st ours {rio.fmt(o.get('first_call_s'), '{:.2f}')}s T {rio.fmt(t.get('first_call_s'), '{:.2f}')}s"
          f" | {r.get('elapsed_s', 0):.1f}s [t={t_total:.0f}s]")
    if r.get("status") != "ok":
        s += f" | {r.get('status').upper()}: {rio._short_error(r)}"
    return s


# ============================================================== breakdown

def profile_kernels(ctx, call_i, nsets, iters, keys, trace_dir):
    """Per-kernel device time per forward call from torch.profiler's CUDA activity."""
    from torch.profiler import profile, ProfilerActivity
    ctx.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            call_i(i % nsets)
        ctx.sync()
    fd, path = tempfile.mkstemp(suffix=".json", dir=trace_dir)
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        agg = kernels_from_trace(path, keys)
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
    return {k: (us / iters / 1e3, cnt / iters) for k, (us, cnt) in agg.items()}


def kernels_from_trace(path, keys):
    """{label: (total microseconds, count)} over the kernel (and memset/memcpy) events of a chrome
    trace written by torch.profiler."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    agg = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        if cat not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        name = str(e.get("name", ""))
        label = roofline.classify_kernel(name, keys) if cat == "kernel" else f"other: {cat}"
        us, cnt = agg.get(label, (0.0, 0))
        agg[label] = (us + float(e.get("dur", 0.0)), cnt + 1)
    return agg


def triton_stage_times(ctx, case, sets, w, nsets, budget_s):
    """Each of mamba_ssm's five forward stages timed on its own (eager calls, events or host
    timer, rotating over the input sets): {stage: ms per call}."""
    torch = ctx.torch
    mod = ctx.triton_mod
    b, h, p, n, q = case.b, case.h, case.p, case.n, case.q
    inter = []
    for s in sets:
        dA, dt_out = mod._chunk_cumsum_fwd(s.dt, w.A, q, dt_bias=w.dt_bias, dt_softplus=case.softplus)
        st = mod._chunk_state_fwd(s.B, s.x, dt_out, dA, seq_idx=None, states_in_fp32=True)
        c = st.shape[1]
        init = s.init.reshape(b, h, p * n) if s.init is not None else None
        st2, fin = mod._state_passing_fwd(st.reshape(b, c, h, p * n), dA[:, :, :, -1], initial_states=init,
                                          seq_idx=None, chunk_size=q, out_dtype=s.C.dtype)
        st2 = st2.reshape(b, c, h, p, n)
        CB = mod._bmm_chunk_fwd(s.C, s.B, q, seq_idx=None, output_dtype=torch.float32)
        inter.append(dict(dA=dA, dt_out=dt_out, st=st, st2=st2, CB=CB, init=init, c=c))
    stages = {
        "_chunk_cumsum_fwd": lambda i: mod._chunk_cumsum_fwd(sets[i].dt, w.A, q, dt_bias=w.dt_bias,
                                                             dt_softplus=case.softplus),
        "_chunk_state_fwd": lambda i: mod._chunk_state_fwd(sets[i].B, sets[i].x, inter[i]["dt_out"],
                                                           inter[i]["dA"], seq_idx=None, states_in_fp32=True),
        "_state_passing_fwd": lambda i: mod._state_passing_fwd(
            inter[i]["st"].reshape(b, inter[i]["c"], h, p * n), inter[i]["dA"][:, :, :, -1],
            initial_states=inter[i]["init"], seq_idx=None, chunk_size=q, out_dtype=sets[i].C.dtype),
        "_bmm_chunk_fwd": lambda i: mod._bmm_chunk_fwd(sets[i].C, sets[i].B, q, seq_idx=None,
                                                       output_dtype=torch.float32),
        "_chunk_scan_fwd": lambda i: mod._chunk_scan_fwd(inter[i]["CB"], sets[i].x, inter[i]["dt_out"],
                                                         inter[i]["dA"], sets[i].C, inter[i]["st2"], D=w.D,
                                                         z=sets[i].z, seq_idx=None),
    }
    out = {}
    for name, fn in stages.items():
        for i in range(nsets):
            fn(i)
        ctx.sync()
        if ctx.cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(nsets):
                fn(i)
            e1.record()
            torch.cuda.synchronize()
            est = max(e0.elapsed_time(e1) / nsets, 1e-4)
            reps = int(min(ctx.args.max_reps, max(ctx.args.min_reps, budget_s * 1e3 / (est * nsets))))
            times = []
            for _ in range(reps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for i in range(nsets):
                    fn(i)
                e1.record()
                torch.cuda.synchronize()
                times.append(e0.elapsed_time(e1) / nsets)
            out[name] = median(times)
        else:
            out[name] = host_time(ctx, fn, nsets, budget_s, "x_ms")["x_ms"]
    inter.clear()
    return out


def run_breakdown(ctx, case, trace_dir):
    torch = ctx.torch
    log(f"\nPer-kernel breakdown: {case.label()} ({rio.shape_label(asdict(case))}, options {case.options()})")
    pr = problem_of(case, torch)
    bd = {"shape": {k: getattr(case, k) for k in ("b", "l", "h", "g", "p", "n", "q")}, "name": case.label(),
          "options": case.options(), "floor": roofline.problem_floor(pr, ctx.copy_gbps, ctx.gemm_tflops)}
    set_bytes = roofline.io_bytes(pr)
    nsets = int(min(ctx.args.max_sets, max(2, math.ceil(ctx.rotate_bytes / set_bytes)))) if ctx.cuda else 2
    bd["nsets"] = nsets
    es_state = {"auto": pr.es, "fp32": 4, "bf16": 2, "fp16": 2}[ctx.args.state_dtype]
    # (the weights stored twice, fp32 and bf16 pairs: bf16 and fp32 inputs, whose calls at the
    # breakdown's length run segment sums, at the dstates whose specialised kernel reads fp32
    # weights; at the others chunk_cumsum stores the pairs alone, as many bytes as fp32: the
    # dstate rule of kWsStatePairs in src/kernels/fused_walk_ws.cu, kept in step by hand)
    both = case.dtype != "fp16" and not (case.n <= 64 or 128 < case.n <= 256)
    floors = {"ours": roofline.ours_kernel_floors(pr, ctx.copy_gbps, ctx.gemm_tflops, es_state=es_state,
                                                  weight_pairs=both),
              "triton": roofline.triton_kernel_floors(pr, ctx.copy_gbps, ctx.gemm_tflops)}
    keys = {"ours": roofline.OURS_KERNEL_KEYS, "triton": roofline.TRITON_KERNEL_KEYS}
    sets = w = None
    try:
        gen = torch.Generator(device=ctx.dev)
        gen.manual_seed(ctx.args.seed + 7)
        w = make_weights(ctx, case, gen)
        sets = [make_set(ctx, case, gen) for _ in range(nsets)]
        for impl in ("ours", "triton"):
            d = bd[impl] = {}
            if impl not in ctx.fns:
                d["error"] = "not loaded: " + ctx.fn_errors.get(impl, "?")
                continue
            try:
                def call_i(i, impl=impl):
                    call_impl(ctx, impl, case, sets[i], w)
                for i in range(nsets):
                    call_i(i)
                ctx.sync()
                rows = []
                if ctx.cuda:
                    iters = max(2 * nsets, 6)
                    per = profile_kernels(ctx, call_i, nsets, iters, keys[impl], trace_dir)
                    for label, (ms, calls) in sorted(per.items(), key=lambda kv: -kv[1][0]):
                        fl = floors[impl].get(label) or {}
                        rows.append({"kernel": label, "calls_per_fwd": calls, "ms_per_fwd": ms,
                                     "floor_ms": fl.get("floor_ms"), "bytes": fl.get("bytes"),
                                     "flops": fl.get("flops"), "bound": fl.get("bound"),
                                     "pct_floor": (100 * fl["floor_ms"] / ms) if fl.get("floor_ms") and ms else None})
                    d["total_ms"] = sum(ms for ms, _ in per.values())
                    d["floor_ms"] = bd["floor"]["floor_ms"]
                d["profiler"] = rows
                if not rows and ctx.cuda:
                    d["profiler_note"] = "the profiler recorded no kernels"
            except Exception as e:
                d["error"] = short_exc(e)
                if not ctx.alive():
                    ctx.dead = f"CUDA context lost in the breakdown ({impl})"
                    raise
            if impl == "triton" and ctx.triton_mod is not None:
                try:
                    st = triton_stage_times(ctx, case, sets, w, nsets, ctx.args.budget_s)
                    d["events"] = []
                    for name, ms in st.items():
                        fl = floors["triton"].get(name) or {}
                        d["events"].append({"kernel": name, "calls_per_fwd": 1, "ms_per_fwd": ms,
                                            "floor_ms": fl.get("floor_ms"), "bytes": fl.get("bytes"),
                                            "flops": fl.get("flops"), "bound": fl.get("bound"),
                                            "pct_floor": (100 * fl["floor_ms"] / ms) if fl.get("floor_ms") and ms
                                            else None})
                except Exception as e:
                    d["events_error"] = short_exc(e)
                    if not ctx.alive():
                        ctx.dead = "CUDA context lost in the Triton stage timing"
                        raise
    except Exception as e:
        bd["error"] = short_exc(e)
    finally:
        sets = w = None
        ctx.free()
    bd["floors"] = floors
    return bd


# ============================================================== environment

def collect_meta(ctx):
    torch = ctx.torch
    m = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "argv": sys.argv[1:],
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": torch.__version__,
        "cuda_runtime": getattr(torch.version, "cuda", None),
        "device": str(ctx.dev),
    }
    try:
        import triton
        m["triton"] = triton.__version__
    except Exception:
        m["triton"] = None
    if ctx.cuda:
        p = torch.cuda.get_device_properties(ctx.dev)
        m["gpu"] = p.name
        m["sm_count"] = p.multi_processor_count
        m["gpu_mem_gib"] = round(p.total_memory / 2 ** 30, 1)
        m["l2_bytes"] = getattr(p, "L2_cache_size", None)
        m["capability"] = f"{p.major}.{p.minor}"
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,"
                                "power.limit,temperature.gpu", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            vals = [v.strip() for v in q.stdout.strip().splitlines()[0].split(",")]
            m["driver"] = vals[0]
            m["nvidia_smi"] = dict(zip(["driver", "sm_clock", "max_sm_clock", "power_limit", "temp_c"], vals))
        except Exception as e:
            m["driver"] = None
            m["nvidia_smi_error"] = str(e)[:200]
    else:
        m["gpu"] = "none (CPU test run)"
    return m


def start_clock_sampler(ctx):
    """The SM clock and power sampler of the benchmark's GPU (by PCI bus id where torch gives it)."""
    try:
        import gpu_clocks
        p = ctx.torch.cuda.get_device_properties(ctx.dev)
        bus = None
        if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        return gpu_clocks.ClockSampler(pci_bus_id=bus, index=ctx.dev.index or 0)
    except Exception as e:
        log(f"bench: no clock sampling ({short_exc(e)})")
        return None


def load_impls(ctx):
    args = ctx.args
    if args.impl in ("both", "ours"):
        try:
            mod = importlib.import_module(args.ours_module)
            ctx.fns["ours"] = getattr(mod, "mamba_chunk_scan_combined")
            ctx.ours_version = getattr(mod, "__version__", None)
            ctx.ours_file = getattr(mod, "__file__", None)
        except Exception as e:
            ctx.fn_errors["ours"] = short_exc(e).splitlines()[-1]
            ctx.ours_version = ctx.ours_file = None
    if args.impl in ("both", "triton"):
        try:
            import mamba_ref_loader
            mod, info = mamba_ref_loader.load(args.mamba_src)
            ctx.triton_mod = mod
            ctx.fns["triton"] = mod.mamba_chunk_scan_combined
            ctx.triton_info = info
        except Exception as e:
            ctx.fn_errors["triton"] = short_exc(e).splitlines()[-1]
            ctx.triton_info = None


# ============================================================== main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Sweeps: anchor = batch 4, 8 heads, 1 group, headdim 64, chunk 128, bf16, "
                                        "D, initial + final states, dstate 64..512 x seqlen 1K..256K; models = "
                                        "Mamba-2 2.7B layers (80 heads, headdim 64, dstate 128, chunk 256, dt_bias + "
                                        "softplus, D) at 1x2K 1x8K 4x8K 1x64K 8x4K, and an 8-group dstate-64 layer "
                                        "(64 heads) at 8x4K; tp = the 2.7B layer's 10 or 20 heads (split over 8 or 4 "
                                        "GPUs) at 1x16K and 1x64K.")
    ap.add_argument("--sweep", action="append", default=[],
                    help="anchor, models, tp or all (repeatable or comma-separated)")
    ap.add_argument("--shape", action="append", default=[], type=parse_shape,
                    help="one shape b,l,h,g,p,n,q (repeatable; 16K style sizes allowed)")
    ap.add_argument("--shape-preset", choices=("anchor", "model"), default="anchor",
                    help="options for --shape: anchor (D, initial + final states) or model "
                         "(D, dt_bias + softplus, no states)")
    ap.add_argument("--breakdown", action="store_true", help="per-kernel breakdown for one shape")
    ap.add_argument("--breakdown-shape", type=parse_shape, default=(4, 64 * K, 8, 1, 64, 128, 128),
                    help="shape of the breakdown (default 4,64K,8,1,64,128,128)")
    ap.add_argument("--breakdown-preset", choices=("anchor", "model"), default="anchor")
    ap.add_argument("--quick", action="store_true",
                    help="fewer anchor seqlens (1K, 16K, 64K), 0.1 s per measurement, float64 check only "
                         "up to 1M token-heads")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds per timing measurement (default 0.3, --quick 0.1)")
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--max-reps", type=int, default=500)
    ap.add_argument("--tune", action="store_true",
                    help="run mamba2_ssd.tune() on each shape before timing ours (the tuning time is "
                         "recorded as tune_s; the first call then uses the cached setting)")
    ap.add_argument("--tune-budget-s", type=float, default=5.0, help="tuning budget per shape (seconds)")
    ap.add_argument("--impl", choices=("both", "ours", "triton"), default="both")
    ap.add_argument("--ours-module", default="mamba2_ssd",
                    help="module whose mamba_chunk_scan_combined is ours (default mamba2_ssd)")
    ap.add_argument("--mamba-src", default=None,
                    help="mamba_ssm source tree (default: .deps/mamba_ssm-2.3.2.post1, else an installed mamba_ssm)")
    ap.add_argument("--state-dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                    help="state_dtype passed to ours (auto: not passed, the package's default)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--f64-max-tokheads", type=int, default=None,
                    help="float64 check only when batch*seqlen*heads <= this (default 4M, --quick 1M)")
    ap.add_argument("--f64-block-bytes", type=int, default=1 << 30,
                    help="largest float64 temporary of the reference (bytes)")
    ap.add_argument("--no-f64", action="store_true", help="skip the float64 error check")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager timing")
    ap.add_argument("--rotate-bytes", type=float, default=None,
                    help="input sets per shape: enough to cover this many bytes (default 4 x L2)")
    ap.add_argument("--max-sets", type=int, default=64)
    ap.add_argument("--ceilings", default=None,
                    help="COPY_GBPS,BF16_TFLOPS: use these instead of measuring")
    ap.add_argument("--time-limit-s", type=float, default=0,
                    help="skip the shapes not started after this many seconds (0: no limit)")
    ap.add_argument("--out", default=None, help="directory for results.json, results.csv, anchor.png")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (testing the script only)")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args(argv)
    sweeps = []
    for s in a.sweep:
        for part in s.split(","):
            part = part.strip()
            if not part:
                continue
            if part == "all":
                sweeps += ["anchor", "models", "tp"]
            elif part in ("anchor", "models", "tp"):
                sweeps.append(part)
            else:
                ap.error(f"unknown sweep {part!r}: anchor, models, tp or all")
    a.sweeps = list(dict.fromkeys(sweeps))
    if not a.sweeps and not a.shape and not a.breakdown:
        ap.error("nothing to do: give --sweep, --shape or --breakdown")
    if a.budget_s is None:
        a.budget_s = 0.1 if a.quick else 0.3
    if a.f64_max_tokheads is None:
        a.f64_max_tokheads = (1 << 20) if a.quick else (1 << 22)
    if a.ceilings:
        try:
            cg, gt = (float(v) for v in a.ceilings.split(","))
            a.ceilings = (cg, gt)
        except ValueError:
            ap.error("--ceilings wants COPY_GBPS,BF16_TFLOPS")
    return a


def build_cases(args):
    cases = []
    for sw in args.sweeps:
        cases += build_sweep(sw, quick=args.quick)
    for vals in args.shape:
        cases.append(shape_case(vals, args.shape_preset))
    for c in cases:
        c.dtype = args.dtype
    return cases


# mamba_ssm's Triton autotuners key on chunk, headdim and dstate (and the arguments' dtypes), not
# on the sequence: a key's first call picks the configs for every later shape. On a 1K shape the
# kernels are as short as the gaps between their launches, which then decide the autotuner's
# timing: two runs of the same benchmark (2026-11-30, v25 and v26) kept configs whose Triton times
# at dstate 64 and 128 differed by 12-37% at every seqlen. So each key's first call is on the
# largest case of that key up to TRITON_TUNE_TOKHEADS token-heads (the anchor's 64K points, the
# 2.7B layer's 4 x 8K). Sweeps tune apart: the model layers and the tensor-parallel slices share
# a key, and the configs picked on one slice served the full layers 2-11% slower (v26), so the
# autotuners' caches are emptied before each sweep's tuning calls.
TRITON_TUNE_TOKHEADS = 3 << 20


def triton_tune_key(case):
    """The cases one Triton autotuning serves (options: which arguments are None)."""
    return (case.q, case.p, case.n, case.dtype, tuple(sorted(case.options().items())))


def triton_tune_cases(cases, cap=TRITON_TUNE_TOKHEADS):
    """For each autotuning key of each sweep, in order of first use: the largest case up to `cap`
    token-heads (else the smallest)."""
    groups = {}
    for c in cases:
        groups.setdefault((c.sweep, triton_tune_key(c)), []).append(c)
    picks = []
    for cs in groups.values():
        size = lambda c: c.b * c.l * c.h  # noqa: E731
        under = [c for c in cs if size(c) <= cap]
        picks.append(max(under, key=size) if under else min(cs, key=size))
    return picks


def reset_triton_autotuners():
    """Empties the configs chosen by the loaded mamba_ssm modules' Triton autotuners; returns how
    many autotuners there were."""
    n = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("mamba_ssm") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            if type(obj).__name__ == "Autotuner" and isinstance(getattr(obj, "cache", None), dict):
                obj.cache.clear()
                n += 1
    return n


def tune_triton(ctx, cases):
    """Runs Triton once on each autotuning key's tuning case of `cases` (one sweep; see
    TRITON_TUNE_TOKHEADS) after emptying the autotuners' caches; returns {"sweep label": seconds
    of that call, or the error}."""
    torch = ctx.torch
    done = {}
    reset = reset_triton_autotuners()
    for case in triton_tune_cases(cases):
        if ctx.dead or ctx.over_time():
            break
        name = f"{case.sweep} {case.label()}"
        try:
            gen = torch.Generator(device=ctx.dev)
            gen.manual_seed(ctx.args.seed)
            w = make_weights(ctx, case, gen)
            s = make_set(ctx, case, gen)
            ctx.sync()
            t0 = time.perf_counter()
            call_impl(ctx, "triton", case, s, w)
            ctx.sync()
            done[name] = round(time.perf_counter() - t0, 2)
            log(f"bench: Triton autotuned on {name} in {done[name]:.1f} s ({reset} autotuners emptied first)")
        except Exception as e:  # noqa: BLE001 - reported; the key then tunes on its first case
            done[name] = "error: " + short_exc(e)
            log(f"bench: Triton tuning call on {name} failed: {short_exc(e)}")
            if not ctx.alive():
                ctx.dead = f"CUDA context lost in Triton's tuning call on {name}"
        s = w = None
        ctx.free()
    return done


def write_outputs(ctx, doc, final=False):
    out = ctx.args.out
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    doc["summary"] = rio.summarize(doc["results"])
    rio.write_json(os.path.join(out, "results.json"), doc)
    rio.write_csv(os.path.join(out, "results.csv"), doc["results"])
    if doc.get("breakdown"):
        rio.write_breakdown_csv(os.path.join(out, "breakdown.csv"), doc["breakdown"])
    if final and not ctx.args.no_plot and any(r.get("sweep") == "anchor" for r in doc["results"]):
        m = doc.get("meta", {})
        title = f"{m.get('gpu', '?')}, torch {m.get('torch')}, triton {m.get('triton')}, {m.get('date_utc', '')}"
        try:
            if rio.plot_anchor(doc["results"], os.path.join(out, "anchor.png"), title=title):
                log(f"plot: {os.path.join(out, 'anchor.png')}")
        except Exception as e:
            log(f"plot failed: {e}")


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        log(f"bench: torch is required ({e})")
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("bench: no CUDA device visible (use --device cpu only to test the script)")
        return 2
    ctx = Ctx(args, torch)
    load_impls(ctx)
    if not ctx.fns:
        log("bench: neither implementation could be loaded:")
        for k, v in ctx.fn_errors.items():
            log(f"  {k}: {v}")
        return 2
    meta = collect_meta(ctx)
    if ctx.cuda:
        ctx.clocks = start_clock_sampler(ctx)
        meta["clock_sampler"] = "not started" if ctx.clocks is None else (ctx.clocks.error or "nvml")
    meta["ours_module"] = args.ours_module
    meta["ours_version"] = getattr(ctx, "ours_version", None)
    meta["ours_file"] = getattr(ctx, "ours_file", None)
    meta["mamba_ssm"] = getattr(ctx, "triton_info", None)
    meta["load_errors"] = dict(ctx.fn_errors)
    log(f"bench: {meta.get('gpu')} | driver {meta.get('driver')} | CUDA {meta.get('cuda_runtime')} | "
        f"torch {meta.get('torch')} | triton {meta.get('triton')} | python {meta.get('python')}")
    log(f"bench: ours = {args.ours_module} {meta['ours_version'] or ''} "
        f"({'loaded' if 'ours' in ctx.fns else 'NOT LOADED: ' + ctx.fn_errors.get('ours', '')})")
    ti = meta["mamba_ssm"]
    log(f"bench: reference = mamba_ssm {ti['version'] if ti else '?'} Triton from {ti['path'] if ti else '-'} "
        f"({'loaded' if 'triton' in ctx.fns else 'NOT LOADED: ' + ctx.fn_errors.get('triton', '')})")
    if ti and not ti.get("version_ok"):
        log(f"bench: WARNING: mamba_ssm version {ti.get('version')} is not "
            f"{__import__('mamba_ref_loader').EXPECTED_VERSION}")
    # ---- ceilings
    if args.ceilings:
        ctx.copy_gbps, ctx.gemm_tflops = args.ceilings
        ceil = {"copy_gbps": ctx.copy_gbps, "bf16_gemm_tflops": ctx.gemm_tflops, "source": "--ceilings"}
    elif ctx.cuda:
        ceil = measure_ceilings(ctx)
        ceil["source"] = "measured"
        ctx.copy_gbps, ctx.gemm_tflops = ceil["copy_gbps"], ceil["bf16_gemm_tflops"]
    else:
        ctx.copy_gbps, ctx.gemm_tflops = 4250.0, 694.0
        ceil = {"copy_gbps": 4250.0, "bf16_gemm_tflops": 694.0, "source": "assumed (CPU test run)"}
    l2 = meta.get("l2_bytes") or 60 * 10 ** 6
    ctx.rotate_bytes = args.rotate_bytes if args.rotate_bytes else 4 * l2
    log(f"bench: ceilings ({ceil['source']}): copy {ctx.copy_gbps / 1e3:.2f} TB/s (read+write), "
        f"bf16 GEMM {ctx.gemm_tflops:.0f} TFLOP/s | input sets cover >= {ctx.rotate_bytes / 1e6:.0f} MB "
        f"(L2 {l2 / 1e6:.0f} MB) | {args.budget_s:g} s per measurement")
    doc = {"meta": meta, "ceilings": ceil, "args": {k: v for k, v in vars(args).items()
                                                       if isinstance(v, (str, int, float, bool, list, tuple,
                                                                         type(None)))},
           "results": [], "breakdown": None}
    cases = build_cases(args)
    tuned_sweep = None
    if cases:
        log(f"bench: {len(cases)} shapes; columns: Triton / ours GPU time per call (CUDA graph), speedup = "
            f"Triton / ours, eager time per call, roofline floor and % of it, rel. L2 error vs float64")
    for i, case in enumerate(cases, 1):
        if ctx.dead or ctx.over_time():
            why = ctx.dead or f"time limit {args.time_limit_s:g} s reached"
            r = {"sweep": case.sweep, "name": case.label(), "b": case.b, "l": case.l, "h": case.h, "g": case.g,
                 "p": case.p, "n": case.n, "q": case.q, "dtype": case.dtype, "options": case.options(),
                 "status": "skipped", "note": why, "ours": {}, "triton": {}, "floor": {}}
            doc["results"].append(r)
            log(f"[{i:>2}/{len(cases)} {case.sweep}] {case.label():<22} skipped: {why}")
            continue
        if "triton" in ctx.fns and case.sweep != tuned_sweep:
            # (each sweep's Triton tuned on its own shapes, just before its cases)
            tuned_sweep = case.sweep
            doc["meta"].setdefault("triton_tuned_on", {}).update(
                tune_triton(ctx, [c for c in cases if c.sweep == case.sweep]))
        r = run_case(ctx, case)
        doc["results"].append(r)
        log(progress_line(i, len(cases), r, ctx.elapsed()))
        try:
            write_outputs(ctx, doc)
        except Exception as e:
            log(f"bench: writing results failed: {e}")
    if args.breakdown:
        bcase = shape_case(args.breakdown_shape, args.breakdown_preset, sweep="breakdown")
        bcase.dtype = args.dtype
        if ctx.dead or ctx.over_time():
            doc["breakdown"] = {"name": bcase.label(), "error": "skipped: " + (ctx.dead or "time limit")}
            log(f"breakdown skipped: {ctx.dead or 'time limit'}")
        else:
            doc["breakdown"] = run_breakdown(ctx, bcase, args.out or tempfile.gettempdir())
            log(rio.breakdown_text(doc["breakdown"]))
            if doc["breakdown"].get("error"):
                log("breakdown error: " + doc["breakdown"]["error"].splitlines()[-1])
    doc["meta"]["elapsed_s"] = ctx.elapsed()
    if ctx.clocks is not None:
        ctx.clocks.close()
        if ctx.clocks.error:
            doc["meta"]["clock_sampler"] = ctx.clocks.error
    write_outputs(ctx, doc, final=True)
    # ---- summary, last
    if doc["results"]:
        log("\n==== summary (GPU time per call by CUDA graph replay; speedup = Triton / ours) ====")
        for sw in dict.fromkeys(r["sweep"] for r in doc["results"]):
            log(f"\n[{sw}]")
            log(rio.text_table([r for r in doc["results"] if r["sweep"] == sw]))
        log("")
        for line in rio.summary_lines(rio.summarize(doc["results"])):
            log(line)
    log(f"\nbench: done in {ctx.elapsed():.0f} s" + (f"; results in {args.out}" if args.out else ""))
    if ctx.dead:
        log(f"bench: {ctx.dead}")
    ok = [r for r in doc["results"] if r.get("status") == "ok"]
    return 0 if ok or (not doc["results"] and doc.get("breakdown")) else 1


if __name__ == "__main__":
    sys.exit(main())
