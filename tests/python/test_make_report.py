"""bench/make_report.py on the stored v13 and v14 runs (CPU only, no GPU or torch needed)."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PERF = os.path.join(REPO, "docs", "perf")


def _report(tmp_path, *extra):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# old\n\n<!-- design-log -->\n## Design log\n\nkept text\n", encoding="utf-8")
    cmd = [sys.executable, os.path.join(REPO, "bench", "make_report.py"),
           os.path.join(PERF, "results-2026-11-30-v14.json"), "--doc", str(doc), "--no-plot", *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return doc.read_text(encoding="utf-8")


def test_previous_run_section(tmp_path):
    text = _report(tmp_path, "--previous", os.path.join(PERF, "results-2026-11-30-v13.json"))
    assert "## Against the previous run (results-2026-11-30-v13.json)" in text
    # geomeans of the stored runs: our anchor times -0.9%, Triton's +6.4%; 1.69x against v13's Triton
    assert "- anchor: ours -0.9%, Triton +6.4% (geomean over 20 points); " \
           "speedup against the previous Triton times 1.69x" in text
    assert "| tp | 2.7B/4 1x64K | 0.5608 → 0.4144 | -26.1% |" in text
    assert text.endswith("<!-- design-log -->\n## Design log\n\nkept text\n")  # the log is kept


def test_no_previous_no_section(tmp_path):
    text = _report(tmp_path)
    assert "Against the previous run" not in text
    assert "## Summary" in text
