"""CPU tests of bench.py: argument parsing, the sweeps' shapes, the profiler-trace parser, the
roofline counts, the mamba_ssm loader, and one whole run on the CPU (mamba_ssm's Triton kernels
under TRITON_INTERPRET=1 in fp16 (the interpreter mishandles bf16), ours = fake_ours with a
planted failure), followed by make_report on its output."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
sys.path.insert(0, HERE)
sys.path.insert(0, BENCH)

import bench  # noqa: E402
import roofline  # noqa: E402
import results_io as rio  # noqa: E402

MAMBA_SRC = os.environ.get("MAMBA_SRC") or next(
    (p for p in (os.path.join(REPO, ".deps", "mamba_ssm-2.3.2.post1"), "/tmp/mamba_ssm-2.3.2.post1")
     if os.path.isdir(p)), None)


def test_parse_args_and_cases():
    a = bench.parse_args(["--sweep", "anchor,models", "--shape", "2,16K,4,2,64,128,256", "--quick"])
    assert a.sweeps == ["anchor", "models"] and a.budget_s == 0.1 and a.f64_max_tokheads == 1 << 20
    cases = bench.build_cases(a)
    assert len(cases) == 12 + 6 + 1
    a = bench.parse_args(["--sweep", "all", "--dtype", "fp16"])
    cases = bench.build_cases(a)
    assert len(cases) == 20 + 6 + 4 and all(c.dtype == "fp16" for c in cases)  # anchor, models, tp
    anchor = [c for c in cases if c.sweep == "anchor"]
    assert {(c.b, c.h, c.g, c.p, c.q) for c in anchor} == {(4, 8, 1, 64, 128)}
    assert sorted({c.n for c in anchor}) == [64, 128, 256, 512]
    assert sorted({c.l for c in anchor}) == [1024, 4096, 16384, 65536, 262144]
    assert all(c.init and c.final and c.D == "head" and not c.softplus and not c.z for c in anchor)
    models = [c for c in cases if c.sweep == "models"]
    assert [(c.b, c.l) for c in models] == [(1, 2048), (1, 8192), (4, 8192), (1, 65536), (8, 4096), (8, 4096)]
    assert all(c.dt_bias and c.softplus and not c.init and not c.final and not c.z for c in models)
    assert (models[0].h, models[0].p, models[0].n, models[0].q, models[0].g) == (80, 64, 128, 256, 1)
    assert (models[-1].h, models[-1].g, models[-1].n) == (64, 8, 64)
    with pytest.raises(SystemExit):
        bench.parse_args([])
    with pytest.raises(SystemExit):
        bench.parse_args(["--shape", "1,2,3,4,5,6"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--shape", "1,64,3,2,16,16,32"])   # heads not a multiple of groups
    assert bench.parse_shape("4x64K,8,1,64,128,128") == (4, 65536, 8, 1, 64, 128, 128)


def test_triton_tune_cases():
    # Triton's autotuning per sweep and key (chunk, headdim, dstate, dtype, options): on its
    # largest case up to 3M token-heads, in the order the keys are first used.
    cases = bench.build_cases(bench.parse_args(["--sweep", "all"]))
    picks = [(c.sweep, c.label()) for c in bench.triton_tune_cases(cases)]
    sweeps = [c.sweep for c in cases]
    first_models, first_tp = sweeps.index("models"), sweeps.index("tp")
    models_picks = [("models", "2.7B 4x8K"), ("models", "8-group n64 8x4K")]
    tp_picks = [("tp", "2.7B/4 1x64K")]
    assert picks == [("anchor", f"n{n} l64K") for n in (64, 128, 256, 512)] + (
        models_picks + tp_picks if first_models < first_tp else tp_picks + models_picks)
    models = bench.build_cases(bench.parse_args(["--sweep", "models"]))
    assert [c.label() for c in bench.triton_tune_cases(models)] == ["2.7B 4x8K", "8-group n64 8x4K"]
    assert [c.label() for c in bench.triton_tune_cases(models, cap=1 << 20)] == ["2.7B 1x8K", "8-group n64 8x4K"]
    # over the cap only: the smallest
    big = bench.build_cases(bench.parse_args(["--shape", "8,256K,80,1,64,128,256", "--shape", "4,256K,80,1,64,128,256"]))
    assert [(c.b, c.l) for c in bench.triton_tune_cases(big)] == [(4, 262144)]


def test_reset_triton_autotuners(monkeypatch):
    # the configs of every Autotuner in a loaded mamba_ssm module are dropped, nothing else
    import types

    class Autotuner:
        def __init__(self):
            self.cache = {("key",): "config"}

    mod, other = types.ModuleType("mamba_ssm.fake_ssd"), types.ModuleType("not_mamba")
    mod.kernel, mod.plain = Autotuner(), {"a": 1}
    other.kernel = Autotuner()
    monkeypatch.setitem(sys.modules, "mamba_ssm.fake_ssd", mod)
    monkeypatch.setitem(sys.modules, "not_mamba", other)
    assert bench.reset_triton_autotuners() >= 1
    assert mod.kernel.cache == {} and mod.plain == {"a": 1} and other.kernel.cache


def test_kernels_from_trace(tmp_path):
    ev = [
        {"ph": "X", "cat": "kernel", "name": "_chunk_scan_fwd_kernel", "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "_chunk_scan_fwd_kernel", "dur": 12.0},
        {"ph": "X", "cat": "kernel", "name": "_chunk_state_fwd_kernel", "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "dur": 1.0},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 0.5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "dur": 99.0},
        {"ph": "i", "cat": "kernel", "name": "x"},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    agg = bench.kernels_from_trace(str(p), roofline.TRITON_KERNEL_KEYS)
    assert agg["_chunk_scan_fwd"] == (22.0, 2)
    assert agg["_chunk_state_fwd"] == (5.0, 1)
    assert agg["other: gpu_memset"] == (0.5, 1)
    assert any(k.startswith("other: void at::native") for k in agg)
    assert sum(c for _, c in agg.values()) == 5
    ours = "void mamba2_ssd::kernels::(anonymous namespace)::compute_out_kernel<cutlass::bfloat16_t, 128>(SsdParams)"
    assert roofline.classify_kernel(ours, roofline.OURS_KERNEL_KEYS) == "compute_out"
    assert roofline.classify_kernel("fwd_pass_state_kernel<64>", roofline.OURS_KERNEL_KEYS) == "fwd_pass_state"
    pass_state = "void mamba2_ssd::kernels::(anonymous namespace)::fwd_pass_state_kernel<cutlass::bfloat16_t, 64, 128, 2, {}>(SsdParams, PassMaps)"
    assert roofline.classify_kernel(pass_state.format("false, false, false"), roofline.OURS_KERNEL_KEYS) == "fwd_pass_state"
    # (kSumsOnly, kCumsum, kSplit: chunk_cumsum's work in the sums or not, the segments split or not)
    for sums in ("true, false, false", "true, true, false", "true, false, true"):
        assert roofline.classify_kernel(pass_state.format(sums), roofline.OURS_KERNEL_KEYS) == "segment_sums"


def test_roofline_matches_design_baseline():
    # DESIGN.md §3 / shared/baseline: bytes floor 0.573 ms at 256K tokens, dstate 64, 4.25 TB/s;
    # its FLOP count was the dense one.
    pr = roofline.Problem(4, 262144, 8, 1, 64, 64, 128, es=2, es_dt=2, D="head", es_init=4, es_final=4)
    f = roofline.problem_floor(pr, 4250.0, 694.0)
    assert abs(f["bytes_ms"] - 0.5729) < 0.002
    assert abs(f["flops_dense"] / 694e12 * 1e3 - 0.4207) < 0.001
    # useful FLOPs: causal halves + all four products
    Q, c, n, p, h = 128, 2048, 64, 64, 8
    pairs = Q * (Q + 1) // 2
    want = 4 * c * (2 * n * pairs + 2 * p * pairs * h + 2 * n * p * Q * h * 2)
    assert roofline.useful_flops(pr) == want
    # no init / no final: chunk 0's C.H and the last chunk's state update drop out
    pr2 = roofline.Problem(1, 300, 2, 1, 4, 8, 128)
    t = roofline.flop_terms(pr2)
    assert t["ch"] == 2 * 8 * 4 * (128 + 44) * 2 and t["state"] == 2 * 4 * 8 * (128 + 128) * 2
    assert t["cb"] == 2 * 8 * (2 * 128 * 129 // 2 + 44 * 45 // 2)
    kt = roofline.triton_kernel_floors(pr, 4250.0, 694.0)
    ko = roofline.ours_kernel_floors(pr, 4250.0, 694.0)
    kp = roofline.ours_kernel_floors(pr, 4250.0, 694.0, weight_pairs=True)
    cq = pr.b * pr.h * pr.nchunks * pr.q
    assert kp["chunk_cumsum"]["bytes"] - ko["chunk_cumsum"]["bytes"] == 4 * cq
    assert set(kt) == {"_chunk_cumsum_fwd", "_chunk_state_fwd", "_state_passing_fwd", "_bmm_chunk_fwd",
                       "_chunk_scan_fwd"}
    assert set(ko) == {"chunk_cumsum", "fwd_pass_state", "compute_out", "fused_walk", "segment_sums"}
    # either path does the useful FLOPs once: the two kernels, or fused_walk (its segment sums
    # redo the state updates of the segments they sum)
    two = sum(ko[k]["flops"] for k in ("chunk_cumsum", "fwd_pass_state", "compute_out"))
    assert sum(v["flops"] for v in kt.values()) == two == ko["fused_walk"]["flops"] == want


@pytest.mark.skipif(MAMBA_SRC is None, reason="no mamba_ssm source tree (scripts/fetch-deps.sh --bench)")
def test_loader_imports_triton_files():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("einops")
    import mamba_ref_loader
    mod, info = mamba_ref_loader.load(MAMBA_SRC)
    assert info["version"] == "2.3.2.post1" and info["version_ok"]
    assert mod.__file__.startswith(os.path.realpath(MAMBA_SRC))
    assert sys.modules["mamba_ssm"].__mamba2_ssd_bench_synthetic__
    assert set(mamba_ref_loader.triton_stages(mod)) == {"_chunk_cumsum_fwd", "_chunk_state_fwd",
                                                        "_state_passing_fwd", "_bmm_chunk_fwd", "_chunk_scan_fwd"}
    for sub in ("ssd_bmm", "ssd_chunk_state", "ssd_state_passing", "ssd_chunk_scan", "softplus"):
        assert sys.modules[f"mamba_ssm.ops.triton.{sub}"].__file__.startswith(os.path.realpath(MAMBA_SRC))
    # loading twice reuses the modules
    mod2, _ = mamba_ref_loader.load(MAMBA_SRC)
    assert mod2 is mod
    with pytest.raises(mamba_ref_loader.LoaderError):
        mamba_ref_loader.load("/nonexistent/path")


@pytest.mark.skipif(MAMBA_SRC is None, reason="no mamba_ssm source tree (scripts/fetch-deps.sh --bench)")
def test_whole_run_on_cpu(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("einops")
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(HERE, "run_cpu_bench.py"), "--device", "cpu", "--dtype", "fp16",
           "--ours-module", "fake_ours", "--mamba-src", MAMBA_SRC,
           "--shape", "2,64,4,2,16,16,32", "--shape", "1,40,2,1,16,16,32",
           "--budget-s", "0.001", "--min-reps", "1", "--breakdown", "--breakdown-shape", "1,32,2,1,16,16,32",
           "--out", str(out)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert any(l.startswith("[ 1/2 shape]") for l in lines)
    assert any(l.startswith("[ 2/2 shape]") and "planted failure" in l for l in lines)
    assert "==== summary" in p.stdout and p.stdout.index("==== summary") > p.stdout.index("Per-kernel breakdown")
    doc = rio.load_json(str(out / "results.json"))
    r1, r2 = doc["results"]
    assert r1["status"] == "ok" and r2["status"] == "error"
    for impl in ("ours", "triton"):
        assert r1[impl]["err_out"] < 2e-3 and r1[impl]["err_final"] < 2e-3, r1[impl]
        assert r1[impl]["graph_ms"] > 0 and r1[impl]["eager_ms"] > 0
    assert r1["ours"]["poisoned_out"] is True
    # one Triton autotuning key (same chunk, headdim, dstate and options): tuned on the larger shape
    tuned = doc["meta"]["triton_tuned_on"]
    assert list(tuned) == ["shape " + r1["name"]] and isinstance(tuned["shape " + r1["name"]], float), tuned
    assert "planted failure" in r2["ours"]["error"] and r2["triton"]["err_out"] < 2e-3
    assert r1["speedup"] == pytest.approx(r1["triton"]["graph_ms"] / r1["ours"]["graph_ms"])
    assert doc["breakdown"]["triton"]["events"] and len(doc["breakdown"]["triton"]["events"]) == 5
    assert (out / "results.csv").exists() and (out / "breakdown.csv").exists()
    md = tmp_path / "PERF.md"
    subprocess.run([sys.executable, os.path.join(BENCH, "make_report.py"), str(out / "results.json"),
                    "--doc", str(md)], check=True, capture_output=True, text=True)
    t = md.read_text()
    assert "## Other shapes" in t and "planted failure" in t and "<!-- design-log -->" in t
    # the time limit skips what has not started
    p = subprocess.run(cmd[:-2] + ["--time-limit-s", "0.001", "--out", str(tmp_path / "o2")], capture_output=True,
                       text=True, timeout=900, env=env)
    doc = rio.load_json(str(tmp_path / "o2" / "results.json"))
    assert [r["status"] for r in doc["results"]] == ["skipped", "skipped"]
    assert "skipped" in (doc["breakdown"].get("error") or "")


@pytest.mark.skipif(MAMBA_SRC is None, reason="no mamba_ssm source tree (scripts/fetch-deps.sh --bench)")
def test_gpu_code_paths_with_mocked_cuda(tmp_path):
    """The GPU-only branches (graph timing, ceilings, event timing, CUDA meta) run without a Python
    error when torch.cuda's API is replaced by host stand-ins (run_mocked_cuda.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("einops")
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(HERE, "run_mocked_cuda.py"), "--dtype", "fp16", "--ours-module", "fake_ours",
           "--mamba-src", MAMBA_SRC, "--shape", "1,64,2,1,16,16,32", "--budget-s", "0.001", "--min-reps", "1",
           "--max-reps", "3", "--max-sets", "2", "--breakdown", "--breakdown-shape", "1,32,2,1,16,16,32",
           "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "MOCK_CALLS" in p.stdout
    calls = eval(p.stdout.split("MOCK_CALLS", 1)[1].strip().splitlines()[0])
    assert calls["capture"] == 2 and calls["replay"] >= 2 * 2
    doc = rio.load_json(str(out / "results.json"))
    r = doc["results"][0]
    assert r["status"] == "ok", r
    for impl in ("ours", "triton"):
        assert r[impl]["graph_method"] == "cuda-graph" and r[impl]["graph_reps"] >= 1
        assert r[impl]["eager_ms"] > 0
    assert doc["meta"]["gpu"] == "FakeGPU" and doc["ceilings"]["source"] == "measured"
    assert len(doc["breakdown"]["triton"]["events"]) == 5
