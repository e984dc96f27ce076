"""A synthetic results document in bench.py's format (for the report and plot tests): the anchor
and model sweeps with made-up times, one failed point, one skipped point, a breakdown."""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
import roofline  # noqa: E402
import results_io as rio  # noqa: E402


def make(seed=0):
    rnd = random.Random(seed)
    copy, gemm = 4250.0, 694.0
    results = []
    cases = bench.build_sweep("anchor") + bench.build_sweep("models")
    for i, c in enumerate(cases):
        pr = roofline.Problem(c.b, c.l, c.h, c.g, c.p, c.n, c.q, es=2, es_dt=2, has_z=c.z, D=c.D,
                              has_bias=c.dt_bias, es_init=4 if c.init else 0, es_final=4 if c.final else 0)
        fl = roofline.problem_floor(pr, copy, gemm)
        t = fl["floor_ms"] * rnd.uniform(7, 11) + 0.02
        o = fl["floor_ms"] * rnd.uniform(1.3, 3) + 0.008
        r = {"sweep": c.sweep, "name": c.label(), "b": c.b, "l": c.l, "h": c.h, "g": c.g, "p": c.p, "n": c.n,
             "q": c.q, "dtype": "bf16", "options": c.options(), "status": "ok", "note": None, "floor": fl,
             "nsets": 3,
             "ours": {"graph_ms": o, "eager_ms": max(o, 0.05), "first_call_s": 0.4, "err_out": 2.0e-3,
                      "err_final": 1.5e-3 if c.final else None},
             "triton": {"graph_ms": t, "eager_ms": max(t, 0.45), "first_call_s": 20.0 if i % 5 == 0 else 0.01,
                        "err_out": 2.3e-3, "err_final": 1.7e-3 if c.final else None}}
        if i == 3:
            r["status"] = "error"
            r["ours"] = {"error": "Traceback...\nRuntimeError: planted | with a pipe"}
        if i == 19:
            r["status"] = "skipped"
            r["note"] = "time limit 480 s reached"
            r["ours"], r["triton"] = {}, {}
        if i == 7:
            r["ours"]["err_out"] = float("nan")
        results.append(rio.fill_derived(r))
    bd = {"name": "b4 l64K h8 g1 p64 n128 q128", "shape": {}, "options": {}, "nsets": 2,
          "floor": {"floor_ms": 0.16, "bound": "memory"},
          "ours": {"profiler": [{"kernel": "compute_out", "calls_per_fwd": 1.0, "ms_per_fwd": 0.2, "floor_ms": 0.1,
                                 "pct_floor": 50.0, "bound": "memory"},
                                {"kernel": "other: gpu_memset", "calls_per_fwd": 1.0, "ms_per_fwd": 0.001}],
                   "total_ms": 0.201, "floor_ms": 0.16},
          "triton": {"profiler": [], "events": [{"kernel": "_chunk_scan_fwd", "calls_per_fwd": 1, "ms_per_fwd": 0.8,
                                                 "floor_ms": 0.2, "pct_floor": 25.0, "bound": "memory"}],
                     "error": None}}
    meta = {"date_utc": "2026-11-30 00:00:00 UTC", "gpu": "NVIDIA H200", "sm_count": 132, "l2_bytes": 62914560,
            "driver": "580.159.03", "cuda_runtime": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0",
            "python": "3.12.3", "ours_version": "0.1.0", "argv": ["--sweep", "anchor,models"],
            "mamba_ssm": {"version": "2.3.2.post1", "found_by": ".deps"}, "elapsed_s": 412.0}
    return {"meta": meta, "ceilings": {"copy_gbps": copy, "bf16_gemm_tflops": gemm, "source": "measured"},
            "args": {}, "results": results, "breakdown": bd}
