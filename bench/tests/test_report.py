import pytest
"""CPU tests of the report side: JSON round trip, CSV, summary, plot, PERFORMANCE.md generation
with the design log preserved."""
import csv
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import make_report  # noqa: E402
import results_io as rio  # noqa: E402
import synthetic  # noqa: E402


def test_json_roundtrip_and_csv(tmp_path):
    doc = synthetic.make()
    p = tmp_path / "results.json"
    rio.write_json(str(p), doc)
    back = rio.load_json(str(p))
    assert len(back["results"]) == len(doc["results"])
    assert math.isnan(back["results"][7]["ours"]["err_out"])
    c = tmp_path / "results.csv"
    rio.write_csv(str(c), back["results"])
    rows = list(csv.DictReader(open(c)))
    assert len(rows) == 26 and rows[0]["sweep"] == "anchor"
    assert rows[3]["ours_error"].startswith("RuntimeError")


def test_summary():
    doc = synthetic.make()
    s = rio.summarize(doc["results"])
    a = s["anchor"]
    assert a["points"] == 20 and a["points_timed"] == 18
    sp = [r["speedup"] for r in doc["results"] if r["sweep"] == "anchor" and r.get("speedup")]
    assert abs(a["geomean_speedup"] - math.exp(sum(map(math.log, sp)) / len(sp))) < 1e-12
    assert a["worst"]["speedup"] == min(sp)
    assert "geomean_speedup_ge16k" in a
    assert math.isnan(a["errors"]["ours_err_out_max"])
    assert s["models"]["points_timed"] == 6
    lines = rio.summary_lines(s)
    assert len(lines) == 2 and "worst" in lines[0]
    txt = rio.text_table(doc["results"])
    assert "skipped" in txt and "planted" in txt


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    doc = synthetic.make()
    p = tmp_path / "a.png"
    assert rio.plot_anchor(doc["results"], str(p), title="t")
    assert p.stat().st_size > 10000
    assert not rio.plot_anchor([r for r in doc["results"] if r["sweep"] == "models"], str(tmp_path / "b.png"))


def test_make_report_preserves_design_log(tmp_path):
    pytest.importorskip("matplotlib")
    doc = synthetic.make()
    j = tmp_path / "results.json"
    rio.write_json(str(j), doc)
    md = tmp_path / "docs" / "PERFORMANCE.md"
    assert make_report.main([str(j), "--doc", str(md)]) == 0
    text = md.read_text()
    assert "## Anchor sweep" in text and "## Model layers" in text and make_report.MARKER in text
    assert (tmp_path / "docs" / "performance-anchor.png").exists()
    assert "](performance-anchor.png)" in text
    # hand-edit the design log, regenerate from a different run: the log survives byte for byte
    log = make_report.MARKER + "\n## Design log\n\nv1: 3.1x predicted, 2.7x measured | because *reasons*.\n\n\ttabs kept\n"
    gen, _ = make_report.split_doc(text)
    md.write_text(gen + log)
    doc2 = synthetic.make(seed=5)
    j2 = tmp_path / "r2.json"
    rio.write_json(str(j2), doc2)
    assert make_report.main([str(j2), "--doc", str(md)]) == 0
    text2 = md.read_text()
    assert text2.endswith(log)
    assert text2.count(make_report.MARKER) == 1
    assert text2 != text


def test_make_report_says_when_it_keeps_an_old_plot(tmp_path, capsys):
    doc = synthetic.make()
    j = tmp_path / "results.json"
    rio.write_json(str(j), doc)
    md = tmp_path / "docs" / "PERFORMANCE.md"
    md.parent.mkdir()
    old = md.parent / "performance-anchor.png"
    old.write_bytes(b"an earlier run's plot")
    assert make_report.main([str(j), "--doc", str(md), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "not redrawn" in out and "kept" in out and "and " + str(old) not in out
    assert old.read_bytes() == b"an earlier run's plot"
    assert "](performance-anchor.png)" in md.read_text()  # (still linked)


def test_make_report_merge_and_refuse(tmp_path):
    doc = synthetic.make()
    a = dict(doc, results=[r for r in doc["results"] if r["sweep"] == "anchor"], breakdown=None)
    m = dict(doc, results=[r for r in doc["results"] if r["sweep"] == "models"])
    ja, jm = tmp_path / "a.json", tmp_path / "m.json"
    rio.write_json(str(ja), a)
    rio.write_json(str(jm), m)
    md = tmp_path / "P.md"
    md.write_text("hand written, no marker\n")
    assert make_report.main([str(ja), str(jm), "--doc", str(md)]) == 2
    assert md.read_text() == "hand written, no marker\n"
    assert make_report.main([str(ja), str(jm), "--doc", str(md), "--force"]) == 0
    t = md.read_text()
    assert "Run 1 (a.json)" in t and "Run 2 (m.json)" in t and "Per-kernel breakdown" in t
    assert t.rstrip().endswith("hand written, no marker")


def test_previous_section_against_the_previous_triton_times():
    prev = synthetic.make(seed=0)
    cur = synthetic.make(seed=1)
    lines = make_report.previous_section(cur["results"], [prev], ["prev.json"])
    text = "\n".join(lines)
    assert lines[0] == "## Against the previous run (prev.json)"
    # every point timed in both runs: previous Triton time / our time now
    both = [(p, c) for p, c in zip(prev["results"], cur["results"])
            if (p.get("ours") or {}).get("graph_ms") and (p.get("triton") or {}).get("graph_ms")
            and (c.get("ours") or {}).get("graph_ms") and (c.get("triton") or {}).get("graph_ms")]
    anchor = [(p["triton"]["graph_ms"] / c["ours"]["graph_ms"], c["l"], c["name"]) for p, c in both
              if c["sweep"] == "anchor"]
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    long = [x[0] for x in anchor if x[1] >= 16384]
    worst = min(anchor)
    line = next(l for l in lines if l.startswith("- anchor:"))
    assert f"speedup against the previous Triton times {gm([x[0] for x in anchor]):.2f}x" in line
    assert f"seqlen >= 16K {gm(long):.2f}x ({len(long)} points)" in line
    assert line.endswith(f"worst {worst[0]:.2f}x at {worst[2]}")
    assert f"| anchor | {anchor[0][2]} |" in text


def test_previous_section_per_kernel():
    prev = synthetic.make(seed=0)
    cur = synthetic.make(seed=1)
    rows = [r for r in rio.breakdown_rows(cur["breakdown"]) if r["source"] == "profiler"]
    assert rows
    before = {(r["impl"], r["kernel"]): r["ms_per_fwd"] for r in rio.breakdown_rows(prev["breakdown"])
              if r["source"] == "profiler"}
    # the previous run's kernels twice as slow: -50.0% each
    for impl in rio.IMPLS:
        for k in (prev["breakdown"].get(impl) or {}).get("profiler") or []:
            k["ms_per_fwd"] = 2 * next(r["ms_per_fwd"] for r in rows if (r["impl"], r["kernel"]) == (impl, k["kernel"]))
    text = "\n".join(make_report.previous_section(cur["results"], [prev], ["prev.json"], cur["breakdown"]))
    assert f"Per kernel at the breakdown shape ({cur['breakdown']['name']})" in text
    both = [r for r in rows if (r["impl"], r["kernel"]) in before]
    assert both  # (the synthetic breakdown has profiler rows for ours only)
    for r in both:
        line = f"| {r['impl']} | {r['kernel']} | {rio.fmt_ms(2 * r['ms_per_fwd'])} → {rio.fmt_ms(r['ms_per_fwd'])} |"
        assert line + " -50.0% |" in text
    # another shape's breakdown: no per-kernel table
    other = dict(cur["breakdown"], name="another shape")
    assert "Per kernel" not in "\n".join(make_report.previous_section(cur["results"], [prev], ["prev.json"], other))
