#!/usr/bin/env python3
"""Regenerates docs/PERFORMANCE.md from the results.json of bench/bench.py.

  python3 bench/make_report.py OUT/results.json [MORE.json ...] [--doc docs/PERFORMANCE.md]
                               [--previous docs/perf/results-<earlier run>.json]

Everything above the marker line `<!-- design-log -->` is rewritten; the marker and everything
below it (the hand-written design log) are kept byte for byte. A new document gets an empty
design log. Several JSON files (for example the anchor and the model sweeps run separately) are
merged: their results are concatenated (a later file's point replaces an earlier one of the same
sweep and name) and the run details of each are listed. The anchor plot is redrawn from the JSON
next to the document (docs/performance-anchor.png) when matplotlib is there. With --previous,
a section compares each point's times with an earlier run's: Triton's times move between runs (its
autotuner picks other configurations), so a ratio can change without a change of ours.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import results_io as rio  # noqa: E402

MARKER = "<!-- design-log -->"
REPO = os.path.dirname(HERE)
DEFAULT_DOC = os.path.join(REPO, "docs", "PERFORMANCE.md")
PLOT_NAME = "performance-anchor.png"

DEFAULT_LOG = (
    MARKER + "\n"
    "## Design log\n\n"
    "Hand-written: each version that mattered, what was predicted, what was measured and why it\n"
    "differed. bench/make_report.py keeps everything from the marker line above to the end of the file.\n"
)


def merge(docs):
    """(meta list, ceilings list, merged results, breakdown or None)."""
    metas, ceils, results, bd = [], [], [], None
    index = {}
    for d in docs:
        metas.append(d.get("meta") or {})
        ceils.append(d.get("ceilings") or {})
        for r in d.get("results") or []:
            key = (r.get("sweep"), r.get("name"))
            if key in index:
                results[index[key]] = r
            else:
                index[key] = len(results)
                results.append(r)
        if d.get("breakdown"):
            bd = d["breakdown"]
    return metas, ceils, results, bd


def _v(x, default="?"):
    return default if x in (None, "") else x


def run_lines(metas, ceils, sources):
    out = []
    for i, (m, c) in enumerate(zip(metas, ceils)):
        ms = m.get("mamba_ssm") or {}
        l2 = m.get("l2_bytes")
        head = f"Run {i + 1} ({os.path.basename(sources[i])})" if len(metas) > 1 else "Run"
        out.append(
            f"- **{head}:** {_v(m.get('date_utc'))}; {_v(m.get('gpu'))}"
            + (f" ({m.get('sm_count')} SMs, {l2 / 1e6:.0f} MB L2)" if m.get("sm_count") and l2 else "")
            + f"; driver {_v(m.get('driver'))}; CUDA {_v(m.get('cuda_runtime'))}; torch {_v(m.get('torch'))}; "
            f"triton {_v(m.get('triton'))}; Python {_v(m.get('python'))}; mamba2_ssd {_v(m.get('ours_version'), '(no version)')}; "
            f"mamba_ssm {_v(ms.get('version'))} (Triton files from {_v(ms.get('found_by'))}); "
            f"`bench/bench.py {' '.join(m.get('argv') or [])}`"
            + (f"; {m['elapsed_s']:.0f} s" if isinstance(m.get("elapsed_s"), (int, float)) else ""))
        if m.get("reconstructed"):
            out.append(f"- **This run's results.json was reconstructed:** {m['reconstructed']}.")
        tuned = m.get("triton_tuned_on")
        out.append(
            f"- **Triton's autotuning{'' if len(metas) == 1 else f' (run {i + 1})'}:** "
            + ("before each sweep, once per key (chunk, headdim, dstate, options) on " +
               ", ".join(f"{k} ({v if isinstance(v, str) else f'{v:.0f} s'})" for k, v in tuned.items())
               if tuned else "on each key's first shape (runs before 2026-11-30 v26)"))
        if c:
            out.append(
                f"- **Ceilings{'' if len(metas) == 1 else f' (run {i + 1})'}** ({_v(c.get('source'))}): device copy "
                f"{rio.fmt(c.get('copy_gbps', 0) / 1e3 if c.get('copy_gbps') else None, '{:.2f}')} TB/s "
                f"(bytes read + written, 1 GiB torch copy), bf16 GEMM "
                f"{rio.fmt(c.get('bf16_gemm_tflops'), '{:.0f}')} TFLOP/s (torch.matmul 8192^3, random data)"
                + (f"; host: a one-element `Tensor.add_` takes {c['host_add_us']:.1f} us per call back to back "
                   "(eager times at short calls follow the host's speed)"
                   if isinstance(c.get("host_add_us"), (int, float)) else "") + ".")
    return out


def summary_table(summary):
    out = ["| sweep | points timed | geomean speedup | seqlen >= 16K | eager geomean | worst point | best point "
           "| ours %floor (geomean) | Triton %floor (geomean) |",
           "|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for sw, s in summary.items():
        w, b = s.get("worst"), s.get("best")
        out.append(
            f"| {sw} | {s.get('points_timed')}/{s.get('points')} | {rio.fmt_x(s.get('geomean_speedup'))} | "
            f"{rio.fmt_x(s.get('geomean_speedup_ge16k')) if 'geomean_speedup_ge16k' in s else '-'} | "
            f"{rio.fmt_x(s.get('geomean_speedup_eager'))} | "
            f"{(rio.fmt_x(w['speedup']) + ' ' + w['name']) if w else '-'} | "
            f"{(rio.fmt_x(b['speedup']) + ' ' + b['name']) if b else '-'} | "
            f"{rio.fmt_pct(s.get('geomean_pct_floor_ours'))} | {rio.fmt_pct(s.get('geomean_pct_floor_triton'))} |")
    return out


def anchor_pivot(results):
    rs = [rio.fill_derived(r) for r in results if r.get("sweep") == "anchor"]
    if not rs:
        return []
    ns = sorted({r["n"] for r in rs})
    ls = sorted({r["l"] for r in rs})
    cell = {(r["n"], r["l"]): r for r in rs}
    out = ["| dstate \\ seqlen | " + " | ".join(rio.seqlen_label(l) for l in ls) + " |",
           "|---|" + "---:|" * len(ls)]
    for n in ns:
        cells = []
        for l in ls:
            r = cell.get((n, l))
            if not r or r.get("speedup") is None:
                cells.append("-" if not r else r.get("status", "-"))
            else:
                cells.append(f"**{rio.fmt_x(r['speedup'])}** ({rio.fmt_ms(r['ours']['graph_ms'])} / "
                             f"{rio.fmt_ms(r['triton']['graph_ms'])})")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


SWEEP_TEXT = {
    "anchor": ("Anchor sweep",
               "batch 4, 8 heads, 1 group, headdim 64, chunk 128, bf16, `D` per head, `initial_states` "
               "(fp32) and `return_final_states=True`; dstate x seqlen."),
    "models": ("Model layers",
               "Mamba-2 2.7B layer calls (80 heads, headdim 64, 1 group, dstate 128, chunk 256, `dt_bias` + "
               "`dt_softplus=True`, `D` per head, `z=None` as with the gated RMSNorm, no initial or final "
               "states: the training-path call of `mamba_ssm.modules.mamba2.Mamba2`), batch x seqlen; plus an "
               "8-group layer (64 heads, headdim 64, dstate 64, chunk 256) at 8 x 4K. Our kernels run these "
               "calls in 128-token chunks (nothing they return depends on where chunks end; "
               "docs/ARCHITECTURE.md)."),
    "tp": ("Tensor-parallel slices",
           "The 2.7B layer's call (options as above) with its 80 heads split over 8 or 4 GPUs (10 or 20 heads "
           "per GPU), one sequence of 16K or 64K tokens: few (row, head) walks, so the chain of chunks of each "
           "walk is the cost and walk segments apply."),
    "shape": ("Other shapes", "Shapes given with `--shape`."),
}

METHOD = """\
## How it is measured

- **GPU time** (the `ms` columns and the speedup): one CUDA graph calls the implementation once on
  each of several input sets in turn (enough sets that together they cover at least 4x the L2, so
  a small shape does not run from the L2); the median over replays (time-budgeted, 0.3 s per
  measurement by default) divided by the number of sets. Speedup = Triton time / our time.
- **SM clock** (the summary's last item, in runs after v50): NVML read every 50 ms by
  `bench/gpu_clocks.py` (read only) while each implementation's replays are timed; per sweep the
  mean over points of each point's mean SM clock, the slowest point's, and the share of samples
  with the power cap (or power brake) set. Long calls reach the 700 W limit, where the driver
  lowers the clock (design log v50), so a run's machine moves them. The cap's flag is also set
  where it takes the clock only a step or two below its maximum: the clocks are what to compare
  (design log v51).
- **Eager time**: back-to-back calls from Python, `torch.cuda.synchronize()` around each batch,
  median per-call time over the batches: what a caller without CUDA graphs sees (launch cost
  included).
- **First call**: wall time of the first call on a shape (compilation). Triton's autotuners key
  on chunk, headdim and dstate, not the sequence: since v27 the benchmark runs them before each
  sweep (caches emptied), once per key on the sweep's largest shape up to 3M token-heads (the run
  lines above name them); in v26 once for all sweeps (up to 2M token-heads); before, on each
  key's first shape, the 1K one in the anchor sweep.
- **Error**: relative L2 norm `||got - ref|| / ||ref||` of `out` and of the final states against
  `bench/ref_f64.py`, the chunked algorithm of docs/SEMANTICS.md in float64 on the GPU, on the
  same bf16 inputs; only where batch x seqlen x heads <= 4M. Our output buffer is filled with NaN
  before the checked call (`out=`), so an element left unwritten shows up as `nan`.
- **Roofline floor** (`bench/roofline.py`): the larger of the fewest bytes over the measured copy
  bandwidth and the useful matrix FLOPs over the measured bf16 GEMM rate. Fewest bytes: x, dt, B,
  C, z, D, A, dt_bias and the initial states read once, `out` and the final states written once.
  Useful FLOPs (2 per multiply-add), per chunk of q tokens, pairs = q(q+1)/2:
  `2 n pairs g` (C B^T, causal half, once per group) + `2 p pairs h` (the masked S.X product)
  + `2 n p q h` (C H^T; skipped for chunk 0 without initial states) + `2 p n q h` (X^T B state
  update; skipped for a row's last chunk when the final states are not returned).
  `%floor` = floor / GPU time. The baseline tables of DESIGN.md §3 counted dense products
  instead (full Q x Q for CB and S.X, all products on every chunk); results.json keeps that
  count as `flops_dense`.
- **Per-kernel breakdown**: device time of each kernel from torch.profiler (CUDA activity) over
  eager calls rotating over the input sets, per forward call; for Triton also each of its five
  stages timed alone with CUDA events (launch gaps included). Each kernel's floor counts its own
  reads and writes, intermediates included (Triton: fp32 chunk states out of `_chunk_state_fwd`,
  states in C's dtype out of `_state_passing_fwd`, an fp32 CB matrix; ours: fp32 cum, dt', state weights and carries,
  chunk states in the state dtype; see bench/roofline.py). Where our call runs two kernels, compute_out
  runs alongside fwd_pass_state (it waits per chunk for the states it needs), so their profiler
  times overlap: each includes the time it shares the GPU with the other, and their sum exceeds
  the call's time. Where it runs fused_walk (the walk and the output in one kernel), the segment
  sums (`segment_sums`: fwd_pass_state's sum-only instantiation) run first, then fused_walk (the
  v12 run, before these labels existed, shows them as `fwd_pass_state` and `other: ...fused_wa...`).
"""


def breakdown_section(bd):
    if not bd:
        return []
    out = [f"## Per-kernel breakdown: {bd.get('name')}", ""]
    if bd.get("error") and not (bd.get("ours") or bd.get("triton")):
        return out + [f"Not measured: {str(bd['error']).strip().splitlines()[-1]}", ""]
    fl = bd.get("floor") or {}
    out.append(f"Options {bd.get('options')}; {bd.get('nsets', '?')} input sets; whole-call floor "
               f"{rio.fmt_ms(fl.get('floor_ms'))} ms ({fl.get('bound', '?')}-bound).")
    out.append("")
    out.append(rio.breakdown_text(bd, markdown=True))
    out.append("")
    return out


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def previous_breakdown(bd, prev_bd):
    """Each kernel's profiler time against the earlier run's breakdown of the same shape: where
    a change of Triton's total comes from (its autotuner's picks move between runs)."""
    if not bd or not prev_bd or bd.get("name") != prev_bd.get("name"):
        return []

    def times(b):
        return {(r["impl"], r["kernel"]): r.get("ms_per_fwd") for r in rio.breakdown_rows(b)
                if r["source"] == "profiler" and (r.get("ms_per_fwd") or 0) > 0}

    now, before = times(bd), times(prev_bd)
    keys = [k for k in now if k in before]
    if not keys:
        return []
    out = ["", f"Per kernel at the breakdown shape ({bd.get('name')}), profiler time per call (ms):", "",
           "| impl | kernel | ms | change |", "|---|---|---:|---:|"]
    for impl, kernel in keys:
        t0, t1 = before[(impl, kernel)], now[(impl, kernel)]
        change = f"{100 * (t1 / t0 - 1):+.1f}%" if t0 > 0 else "-"
        out.append(f"| {impl} | {kernel} | {rio.fmt_ms(t0)} → {rio.fmt_ms(t1)} | {change} |")
    return out


def previous_section(results, prev_docs, prev_sources, bd=None):
    """Our and Triton's GPU times against an earlier run's, point by point (same sweep and name),
    and per kernel where both runs have a breakdown of the same shape."""
    _, _, prev, prev_bd = merge(prev_docs)
    index = {(r.get("sweep"), r.get("name")): r for r in prev}

    def ms(r, who):
        return ((r or {}).get(who) or {}).get("graph_ms")

    rows, per_sweep = [], {}
    for r in results:
        o = index.get((r.get("sweep"), r.get("name")))
        u1, t1, u0, t0 = ms(r, "ours"), ms(r, "triton"), ms(o, "ours"), ms(o, "triton")
        if not (u1 and t1 and u0 and t0):
            continue
        per_sweep.setdefault(r.get("sweep"), []).append((u1 / u0, t1 / t0, t0 / u1, r.get("l") or 0, r.get("name")))
        rows.append(f"| {r.get('sweep')} | {r.get('name')} | {u0:.4g} → {u1:.4g} | {100 * (u1 / u0 - 1):+.1f}% "
                    f"| {t0:.4g} → {t1:.4g} | {100 * (t1 / t0 - 1):+.1f}% | {t0 / u1:.2f}x |")
    if not rows:
        return []
    names = ", ".join(os.path.basename(p) for p in prev_sources)
    out = [f"## Against the previous run ({names})", "",
           "GPU times per call (ms) of the points both runs timed. Triton's times move between runs (its "
           "autotuner), so the last column divides the previous run's Triton time by ours: the part of "
           "a ratio's change that is ours.", ""]
    for sw, v in per_sweep.items():
        long = [x[2] for x in v if x[3] >= 16384]
        worst = min(v, key=lambda x: x[2])
        out.append(f"- {sw}: ours {100 * (_geomean([x[0] for x in v]) - 1):+.1f}%, Triton "
                   f"{100 * (_geomean([x[1] for x in v]) - 1):+.1f}% (geomean over {len(v)} points); "
                   f"speedup against the previous Triton times {_geomean([x[2] for x in v]):.2f}x"
                   + (f", seqlen >= 16K {_geomean(long):.2f}x ({len(long)} points)" if long else "")
                   + f", worst {worst[2]:.2f}x at {worst[4]}")
    out += ["", "| sweep | shape | ours ms | ours change | Triton ms | Triton change | previous Triton / ours |",
            "|---|---|---:|---:|---:|---:|---:|"] + rows
    return out + previous_breakdown(bd, prev_bd) + [""]


def render(docs, sources, plot_rel=None, prev_docs=None, prev_sources=()):
    metas, ceils, results, bd = merge(docs)
    summary = rio.summarize(results)
    lines = [
        "# Performance",
        "",
        "<!-- Generated by bench/make_report.py from the results.json of bench/bench.py. Everything above "
        "the design-log marker is rewritten on each run: change the generator, not this part. -->",
        "",
        "`mamba2_ssd.mamba_chunk_scan_combined` against the Triton forward of mamba_ssm 2.3.2.post1 "
        "(`mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`), on identical inputs in one "
        "process on one GPU. Speedup = Triton time / our time (above 1: we are faster).",
        "",
    ]
    lines += run_lines(metas, ceils, sources)
    lines += ["", "## Summary", ""] + summary_table(summary) + [""]
    for line in rio.summary_lines(summary):
        lines.append(f"- {line}")
    lines.append("")
    order = [s for s in ("anchor", "models", "tp", "shape") if any(r.get("sweep") == s for r in results)]
    order += [s for s in dict.fromkeys(r.get("sweep") for r in results) if s not in order]
    for sw in order:
        title, text = SWEEP_TEXT.get(sw, (sw, ""))
        rs = [r for r in results if r.get("sweep") == sw]
        lines += [f"## {title}", "", text, ""]
        if sw == "anchor":
            lines += ["Speedup (our ms / Triton ms), GPU time per call:", ""] + anchor_pivot(results) + [""]
            if plot_rel:
                lines += [f"![speedup and fraction of the roofline floor, anchor sweep]({plot_rel})", ""]
        lines += [rio.markdown_table(rs), ""]
    if prev_docs:
        lines += previous_section(results, prev_docs, prev_sources, bd)
    lines += breakdown_section(bd)
    lines += [METHOD]
    return "\n".join(lines).rstrip() + "\n\n"


def render_placeholder():
    return "\n".join([
        "# Performance",
        "",
        "<!-- Generated by bench/make_report.py from the results.json of bench/bench.py. Everything above "
        "the design-log marker is rewritten on each run: change the generator, not this part. -->",
        "",
        "No measurements yet. On the H200: `bash bench/run_on_device.sh` (see that script), then here:",
        "`python3 bench/make_report.py <fetched OUT>/results.json`.",
        "",
        METHOD,
    ]).rstrip() + "\n\n"


def split_doc(text):
    """(generated part, preserved part starting at the marker line) or (text, None) without marker."""
    i = text.find(MARKER)
    if i < 0:
        return text, None
    j = text.rfind("\n", 0, i) + 1   # start of the marker's line
    return text[:j], text[j:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="*", help="results.json written by bench/bench.py --out")
    ap.add_argument("--placeholder", action="store_true",
                    help="write the no-results version of the generated part (no JSON needed)")
    ap.add_argument("--doc", default=DEFAULT_DOC, help="document to (re)write (default docs/PERFORMANCE.md)")
    ap.add_argument("--no-plot", action="store_true", help="do not redraw the plot")
    ap.add_argument("--previous", action="append", default=[], metavar="JSON",
                    help="an earlier run's results.json: adds a section comparing each point's times with it")
    ap.add_argument("--force", action="store_true",
                    help="rewrite a document that has no design-log marker (its text is moved below one)")
    a = ap.parse_args(argv)
    if not a.json and not a.placeholder:
        ap.error("give one or more results.json files (or --placeholder)")
    docs = [rio.load_json(p) for p in a.json]
    preserved = None
    if os.path.exists(a.doc):
        with open(a.doc, encoding="utf-8") as f:
            old = f.read()
        _, preserved = split_doc(old)
        if preserved is None:
            if not a.force:
                print(f"make_report: {a.doc} has no '{MARKER}' line; refusing to overwrite it "
                      f"(--force keeps its text below a new marker)", file=sys.stderr)
                return 2
            preserved = MARKER + "\n## Design log\n\n" + old
    if preserved is None:
        preserved = DEFAULT_LOG
    doc_dir = os.path.dirname(os.path.abspath(a.doc))
    plot_path = os.path.join(doc_dir, PLOT_NAME)
    plot_rel = None
    drawn = False
    _, _, results, _ = merge(docs)
    if a.placeholder:
        results = []
    if any(r.get("sweep") == "anchor" for r in results):
        if not a.no_plot:
            m = docs[0].get("meta") or {}
            title = f"{m.get('gpu', '?')}, torch {m.get('torch')}, triton {m.get('triton')}, {m.get('date_utc', '')}"
            try:
                drawn = rio.plot_anchor(results, plot_path, title=title)
            except Exception as e:
                print(f"make_report: plot failed: {e}", file=sys.stderr)
        if drawn or os.path.exists(plot_path):
            plot_rel = PLOT_NAME
    prev_docs = [rio.load_json(p) for p in a.previous]
    text = (render_placeholder() if a.placeholder
            else render(docs, a.json, plot_rel, prev_docs, a.previous)) + preserved
    os.makedirs(doc_dir, exist_ok=True)
    tmp = a.doc + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, a.doc)
    if plot_rel and not drawn:
        # (an existing plot is linked as it is: it may be an earlier run's)
        print(f"make_report: wrote {a.doc}; {plot_path} not redrawn (--no-plot, matplotlib missing or the plot "
              "failed), the existing file kept")
    else:
        print(f"make_report: wrote {a.doc}" + (f" and {plot_path}" if plot_rel else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
