"""Results of bench.py: summaries, JSON/CSV files, text and markdown tables, the anchor plot.
Pure Python (matplotlib only for the plot), shared by bench.py and make_report.py.

A result record (one per shape) looks like:
  {"sweep": "anchor", "name": "...", "b":4, "l":1024, "h":8, "g":1, "p":64, "n":64, "q":128,
   "dtype": "bf16", "options": {...}, "status": "ok" | "error" | "skipped", "note": str|None,
   "floor": {"bytes", "flops", "flops_dense", "bytes_ms", "flops_ms", "floor_ms", "bound"},
   "ours":   {"graph_ms", "eager_ms", "first_call_s", "err_out", "err_final", "error", ...},
   "triton": {...same...},
   "speedup": triton graph_ms / ours graph_ms, "speedup_eager": same for eager_ms,
   "pct_floor_ours", "pct_floor_triton": 100 * floor_ms / graph_ms}
"""
from __future__ import annotations

import csv
import json
import math
import os

IMPLS = ("ours", "triton")


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def geomean(vals):
    vals = [v for v in vals if _num(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def fill_derived(r: dict) -> dict:
    """(Re)computes speedups and % of floor from the raw times in a record."""
    o = r.get("ours") or {}
    t = r.get("triton") or {}
    fl = (r.get("floor") or {}).get("floor_ms")

    def ratio(a, b):
        return a / b if _num(a) and _num(b) and b > 0 else None

    r["speedup"] = ratio(t.get("graph_ms"), o.get("graph_ms"))
    r["speedup_eager"] = ratio(t.get("eager_ms"), o.get("eager_ms"))
    for impl in IMPLS:
        d = r.get(impl) or {}
        v = ratio(fl, d.get("graph_ms"))
        r["pct_floor_" + impl] = 100.0 * v if v is not None else None
    return r


def seqlen_label(l: int) -> str:
    if l % (1 << 20) == 0:
        return f"{l >> 20}M"
    if l % 1024 == 0:
        return f"{l >> 10}K"
    return str(l)


def shape_label(r: dict) -> str:
    return f"b{r['b']} l{seqlen_label(r['l'])} h{r['h']} g{r['g']} p{r['p']} n{r['n']} q{r['q']}"


def summarize(results: list) -> dict:
    """Per sweep: geometric means of the speedups (graph and eager), over seqlen >= 16K for the
    anchor sweep too, the worst point, and how many points counted."""
    out = {}
    sweeps = []
    for r in results:
        if r.get("sweep") not in sweeps:
            sweeps.append(r.get("sweep"))
    for sw in sweeps:
        rs = [fill_derived(r) for r in results if r.get("sweep") == sw]
        ok = [r for r in rs if _num(r.get("speedup"))]
        s = {
            "points": len(rs),
            "points_timed": len(ok),
            "geomean_speedup": geomean([r["speedup"] for r in ok]),
            "geomean_speedup_eager": geomean([r.get("speedup_eager") for r in rs]),
            "geomean_pct_floor_ours": geomean([r.get("pct_floor_ours") for r in rs]),
            "geomean_pct_floor_triton": geomean([r.get("pct_floor_triton") for r in rs]),
        }
        long = [r for r in ok if r["l"] >= 16384]
        if sw == "anchor" or long and len(long) != len(ok):
            s["geomean_speedup_ge16k"] = geomean([r["speedup"] for r in long])
            s["points_ge16k"] = len(long)
        if ok:
            w = min(ok, key=lambda r: r["speedup"])
            s["worst"] = {"name": w.get("name") or shape_label(w), "speedup": w["speedup"],
                          "ours_ms": w["ours"]["graph_ms"], "triton_ms": w["triton"]["graph_ms"]}
            b = max(ok, key=lambda r: r["speedup"])
            s["best"] = {"name": b.get("name") or shape_label(b), "speedup": b["speedup"]}
        errs = {}
        for impl in IMPLS:
            for k in ("err_out", "err_final"):
                vals = [(r.get(impl) or {}).get(k) for r in rs]
                vals = [v for v in vals if v is not None]
                if vals:
                    errs[f"{impl}_{k}_max"] = (float("nan") if any(not _num(v) for v in vals)
                                              else max(vals))
        s["errors"] = errs
        # the SM clock and power-cap share of the timed replays (bench/gpu_clocks.py), where sampled
        for impl in IMPLS:
            mhz = [(r.get(impl) or {}).get("sm_mhz") for r in rs]
            cap = [(r.get(impl) or {}).get("power_capped") for r in rs]
            mhz, cap = [v for v in mhz if _num(v)], [v for v in cap if _num(v)]
            if mhz:
                s[f"{impl}_sm_mhz_mean"] = sum(mhz) / len(mhz)
                s[f"{impl}_sm_mhz_min"] = min(mhz)
            if cap:
                s[f"{impl}_power_capped_mean"] = sum(cap) / len(cap)
        out[sw] = s
    return out


# ----------------------------------------------------------------- files

def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o)}")


def _clean(o):
    """JSON has no NaN/inf: write them as strings 'nan'/'inf' (read back by load_json)."""
    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def _unclean(o):
    if isinstance(o, str) and o in ("nan", "inf", "-inf"):
        return float(o)
    if isinstance(o, dict):
        return {k: _unclean(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_unclean(v) for v in o]
    return o


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(_clean(doc), f, indent=1, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)


def load_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return _unclean(json.load(f))


CSV_FIELDS = [
    "sweep", "name", "status", "b", "l", "h", "g", "p", "n", "q", "dtype",
    "D", "z", "dt_bias", "softplus", "init", "final", "nsets",
    "triton_graph_ms", "ours_graph_ms", "speedup", "triton_eager_ms", "ours_eager_ms", "speedup_eager",
    "floor_ms", "floor_bound", "bytes", "flops", "flops_dense", "bytes_ms", "flops_ms",
    "pct_floor_ours", "pct_floor_triton",
    "ours_err_out", "triton_err_out", "ours_err_final", "triton_err_final",
    "ours_first_call_s", "triton_first_call_s", "ours_repeat_equal", "ours_nonfinite_out", "triton_nonfinite_out",
    "ours_error", "triton_error", "note",
]


def csv_row(r: dict) -> dict:
    fill_derived(r)
    o, t = r.get("ours") or {}, r.get("triton") or {}
    fl = r.get("floor") or {}
    opt = r.get("options") or {}
    row = {k: r.get(k) for k in ("sweep", "name", "status", "b", "l", "h", "g", "p", "n", "q", "dtype",
                                 "nsets", "speedup", "speedup_eager", "pct_floor_ours", "pct_floor_triton",
                                 "note")}
    row.update({k: opt.get(k) for k in ("D", "z", "dt_bias", "softplus", "init", "final")})
    for impl, d in (("ours", o), ("triton", t)):
        for k in ("graph_ms", "eager_ms", "err_out", "err_final", "first_call_s", "error", "repeat_equal",
                  "nonfinite_out"):
            row[f"{impl}_{k}"] = d.get(k)
    row.update({"floor_ms": fl.get("floor_ms"), "floor_bound": fl.get("bound"), "bytes": fl.get("bytes"),
                "flops": fl.get("flops"), "flops_dense": fl.get("flops_dense"),
                "bytes_ms": fl.get("bytes_ms"), "flops_ms": fl.get("flops_ms")})
    for k in ("ours_error", "triton_error", "note"):
        if isinstance(row.get(k), str):
            row[k] = row[k].splitlines()[-1][:300] if row[k] else row[k]
    return {k: row.get(k) for k in CSV_FIELDS}


def write_csv(path: str, results: list) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in results:
            w.writerow(csv_row(r))
    os.replace(tmp, path)


BREAKDOWN_FIELDS = ["impl", "kernel", "calls_per_fwd", "ms_per_fwd", "floor_ms", "pct_floor", "bytes", "flops",
                    "bound", "source"]


def write_breakdown_csv(path: str, bd: dict) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=BREAKDOWN_FIELDS)
        w.writeheader()
        for row in breakdown_rows(bd):
            w.writerow({k: row.get(k) for k in BREAKDOWN_FIELDS})


def breakdown_rows(bd: dict) -> list:
    rows = []
    for impl in IMPLS:
        for src in ("profiler", "events"):
            for k in (bd.get(impl) or {}).get(src) or []:
                rows.append(dict(k, impl=impl, source=src))
    return rows


# ----------------------------------------------------------------- formatting

def fmt(v, spec="{:.3f}", none="-"):
    if v is None:
        return none
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if not _num(v):
        return str(v)
    return spec.format(v)


def fmt_ms(v):
    if not _num(v):
        return fmt(v)
    return f"{v:.4f}" if v < 0.1 else (f"{v:.3f}" if v < 100 else f"{v:.1f}")


def fmt_err(v):
    return fmt(v, "{:.1e}")


def fmt_x(v):
    return fmt(v, "{:.2f}x")


def fmt_pct(v):
    return fmt(v, "{:.1f}%")


def _row_cells(r: dict) -> list:
    fill_derived(r)
    o, t = r.get("ours") or {}, r.get("triton") or {}
    fl = r.get("floor") or {}
    if r.get("status") == "skipped":
        return [r.get("name") or shape_label(r), "skipped"] + [""] * 9 + [str(r.get("note") or "")[:80]]
    return [
        r.get("name") or shape_label(r),
        fmt_ms(t.get("graph_ms")), fmt_ms(o.get("graph_ms")), fmt_x(r.get("speedup")),
        f"{fmt_ms(t.get('eager_ms'))} / {fmt_ms(o.get('eager_ms'))}",
        f"{fmt_ms(fl.get('floor_ms'))} {(fl.get('bound') or '-')[:3]}",
        fmt_pct(r.get("pct_floor_ours")), fmt_pct(r.get("pct_floor_triton")),
        f"{fmt_err(o.get('err_out'))} / {fmt_err(t.get('err_out'))}",
        f"{fmt_err(o.get('err_final'))} / {fmt_err(t.get('err_final'))}",
        fmt(o.get("first_call_s"), "{:.2f}"),
        _short_error(r),
    ]


HEADERS = ["shape", "Triton ms", "ours ms", "speedup", "eager ms T / ours", "floor ms",
           "ours %floor", "Triton %floor", "err out ours / T", "err final ours / T", "ours 1st s", "note"]


def _short_error(r):
    msgs = []
    for impl in IMPLS:
        d = r.get(impl) or {}
        for k in ("error", "graph_error", "eager_error", "check_error"):
            if d.get(k):
                line = str(d[k]).strip().splitlines()[-1] if str(d[k]).strip() else str(d[k])
                msgs.append(f"{impl} {k.replace('_error', '') if k != 'error' else 'failed'}: {line[:80]}")
        if d.get("repeat_equal") is False:
            msgs.append(f"{impl}: two calls on the same inputs differ")
        if d.get("nonfinite_out"):
            msgs.append(f"{impl}: {d['nonfinite_out']} non-finite outputs")
    if r.get("note"):
        msgs.append(str(r["note"])[:80])
    return "; ".join(msgs)


def text_table(results: list) -> str:
    rows = [HEADERS] + [_row_cells(r) for r in results]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(HEADERS) - 1)]
    lines = []
    for row in rows:
        cells = [str(row[i]).rjust(widths[i]) if i else str(row[i]).ljust(widths[i])
                 for i in range(len(HEADERS) - 1)]
        lines.append("  ".join(cells) + ("  " + row[-1] if row[-1] else ""))
    return "\n".join(lines)


def markdown_table(results: list) -> str:
    rows = [HEADERS] + [_row_cells(r) for r in results]
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 2) + ["---"]) + "|"]
    for row in rows[1:]:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(out)


def summary_lines(summary: dict) -> list:
    lines = []
    for sw, s in summary.items():
        parts = [f"{sw}: geomean speedup {fmt_x(s.get('geomean_speedup'))} over {s.get('points_timed')}"
                 f"/{s.get('points')} points"]
        if "geomean_speedup_ge16k" in s:
            parts.append(f"seqlen >= 16K {fmt_x(s.get('geomean_speedup_ge16k'))} ({s.get('points_ge16k')} points)")
        parts.append(f"eager {fmt_x(s.get('geomean_speedup_eager'))}")
        if s.get("worst"):
            w = s["worst"]
            parts.append(f"worst {fmt_x(w['speedup'])} at {w['name']}")
        parts.append(f"geomean %floor ours {fmt_pct(s.get('geomean_pct_floor_ours'))}, "
                     f"Triton {fmt_pct(s.get('geomean_pct_floor_triton'))}")
        e = s.get("errors") or {}
        if e:
            parts.append("max err out ours/T " + f"{fmt_err(e.get('ours_err_out_max'))}/{fmt_err(e.get('triton_err_out_max'))}"
                         + (", final " + f"{fmt_err(e.get('ours_err_final_max'))}/{fmt_err(e.get('triton_err_final_max'))}"
                            if "ours_err_final_max" in e or "triton_err_final_max" in e else ""))
        if "ours_sm_mhz_mean" in s or "triton_sm_mhz_mean" in s:
            def clock(impl):
                m, c = s.get(f"{impl}_sm_mhz_mean"), s.get(f"{impl}_power_capped_mean")
                return (f"{m:.0f} MHz (slowest point {s[f'{impl}_sm_mhz_min']:.0f})" if m is not None else "-") + \
                    (f", {100 * c:.0f}% of samples power-capped" if c is not None else "")
            parts.append(f"SM clock while timed: ours {clock('ours')}; Triton {clock('triton')}")
        lines.append("; ".join(parts))
    return lines


def breakdown_text(bd: dict, markdown: bool = False) -> str:
    if not bd:
        return ""
    head = ["impl", "kernel", "calls/fwd", "ms/fwd", "floor ms", "%floor", "bound", "source"]
    rows = []
    for row in breakdown_rows(bd):
        rows.append([row["impl"], row["kernel"], fmt(row.get("calls_per_fwd"), "{:.0f}"),
                     fmt_ms(row.get("ms_per_fwd")), fmt_ms(row.get("floor_ms")), fmt_pct(row.get("pct_floor")),
                     row.get("bound") or "-", row["source"]])
    for impl in IMPLS:
        d = bd.get(impl) or {}
        if _num(d.get("total_ms")):
            rows.append([impl, "(sum of kernels)", "", fmt_ms(d["total_ms"]), fmt_ms(d.get("floor_ms")),
                         fmt_pct(100 * d["floor_ms"] / d["total_ms"] if _num(d.get("floor_ms")) and d["total_ms"] > 0
                                 else None), "", "profiler"])
        if d.get("error"):
            rows.append([impl, "error: " + str(d["error"]).strip().splitlines()[-1][:100], "", "", "", "", "", ""])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|---|---|"]
        out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(out)
    allr = [head] + rows
    widths = [max(len(str(r[i])) for r in allr) for i in range(len(head))]
    return "\n".join("  ".join(str(r[i]).ljust(widths[i]) for i in range(len(head))) for r in allr)


# ----------------------------------------------------------------- plot

def plot_anchor(results: list, path: str, title: str = "") -> bool:
    """Speedup vs seqlen per dstate (left) and % of the roofline floor (right), anchor sweep.
    Returns False when there is nothing to plot or matplotlib is missing."""
    rs = [fill_derived(r) for r in results if r.get("sweep") == "anchor"]
    if not rs:
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    dstates = sorted({r["n"] for r in rs})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    any_point = False
    for i, n in enumerate(dstates):
        pts = sorted([r for r in rs if r["n"] == n], key=lambda r: r["l"])
        col = colors[i % len(colors)]
        sp = [(r["l"], r["speedup"]) for r in pts if _num(r.get("speedup"))]
        if sp:
            any_point = True
            ax1.plot([a for a, _ in sp], [b for _, b in sp], "o-", color=col, label=f"dstate {n}")
        po = [(r["l"], r["pct_floor_ours"]) for r in pts if _num(r.get("pct_floor_ours"))]
        pt = [(r["l"], r["pct_floor_triton"]) for r in pts if _num(r.get("pct_floor_triton"))]
        if po:
            any_point = True
            ax2.plot([a for a, _ in po], [b for _, b in po], "o-", color=col, label=f"ours, dstate {n}")
        if pt:
            any_point = True
            ax2.plot([a for a, _ in pt], [b for _, b in pt], "x--", color=col, alpha=0.7,
                     label=f"Triton, dstate {n}")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ls = sorted({r["l"] for r in rs})
        ax.set_xticks(ls)
        ax.set_xticklabels([seqlen_label(v) for v in ls])
        ax.set_xlabel("seqlen (batch 4, 8 heads, headdim 64, chunk 128, bf16)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.axhline(1.0, color="gray", lw=1)
    ax1.set_ylabel("speedup (Triton time / our time, CUDA graph)")
    ax1.set_title("Speedup over mamba_ssm 2.3.2.post1 Triton")
    ax2.set_ylabel("% of roofline floor")
    top = max([100.0] + [v for r in rs for v in (r.get("pct_floor_ours"), r.get("pct_floor_triton")) if _num(v)])
    ax2.set_ylim(0, top * 1.05)
    ax2.set_title("Fraction of the roofline floor reached")
    if any_point:
        ax1.legend(fontsize=8)
        ax2.legend(fontsize=7, ncol=2, loc="best")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
