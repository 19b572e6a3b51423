"""The published tools study (reports/local-cpu-tools): one vLLM CPU server measured by servelab,
AIPerf, GuideLLM and `vllm bench serve` (benchmarks/tools_study.py), imported. Every figure of a
tool whose definition is servelab's agrees with servelab's recomputation from the tool's own
per-request data within 2 %, and every difference above 2 % carries its definitional reason, on
the page too."""

from __future__ import annotations

import json

import pytest

from paths import ROOT
from servelab.report.lint import lint_html
from servelab.runfolder import RunFolder

STUDY = ROOT / "reports" / "local-cpu-tools"
TOOLS = ["aiperf", "guidellm", "servelab", "vllm-bench"]
pytestmark = pytest.mark.skipif(not (STUDY / "imports").is_dir(), reason="the tools study is not published")


def _rows(tool):
    return json.loads((STUDY / "imports" / tool / "harmonised.json").read_text())["rows"]


def test_every_tool_has_a_run_folder_servelabs_summary_reads():
    assert sorted(p.name for p in (STUDY / "imports").iterdir() if p.is_dir()) == TOOLS
    for tool in TOOLS:
        s = RunFolder(STUDY / "imports" / tool).summary
        assert sorted(s["concurrency"]) == [1, 4] and (s["rounds"] == 2).all()


@pytest.mark.parametrize("tool", ["aiperf", "guidellm", "vllm-bench"])
def test_same_definitions_agree_within_2_percent_and_every_larger_difference_has_a_reason(tool):
    rows = [r for r in _rows(tool) if r["tool_value"] is not None]
    assert rows
    from servelab.analysis.harmonise import definitions

    edge = {f.field: f.no_decode_why for f in definitions().of(tool).figures if f.no_decode_why}
    for r in rows:
        if abs(r["diff_pct"]) <= 2.0:
            continue
        assert r["reason"] and not r["reason"].startswith("unexplained"), r
        if r["same"]:  # same definition: only a request without decode time, counted the tool's way, may part them
            assert r["reason"].startswith(edge[r["field"]]), r


def test_the_page_gives_every_reason_and_passes_the_lint():
    page = STUDY / "index.html"
    assert lint_html(page) == []
    html = page.read_text()
    for tool in ("AIPerf", "GuideLLM", "vllm bench serve"):
        assert tool in html
    reasons = {r["reason"] for t in ("aiperf", "guidellm", "vllm-bench") for r in _rows(t)
               if r["tool_value"] is not None and abs(r["diff_pct"]) > 2.0}
    import html as h

    text = h.unescape(html)
    for reason in reasons:
        assert reason in text, reason
    assert "unexplained:" not in text  # no reason of a figure is (the prose says what the word would mean)


def test_the_import_section_lists_each_files_tool_version_format_window_and_sample():
    from servelab.results.formats import SCHEMAS
    from servelab.results.pages import imported_table

    t = imported_table({tool: RunFolder(STUDY / "imports" / tool) for tool in TOOLS}).set_index("tool")
    assert list(t.index) == ["AIPerf", "GuideLLM", "vllm bench serve"]  # servelab's own run was not imported
    assert list(t["version"]) == ["0.13.0", "0.8.1", "not stated"]
    assert list(t["format recognised"]) == [SCHEMAS["aiperf-0.2"], SCHEMAS["guidellm-v2"], SCHEMAS["vllm-bench"]]
    assert (t["sample"] == "36 of 36 requests stored").all() and t["measurement window"].str.endswith("none outside it").all()
    import html as h

    text = h.unescape((STUDY / "index.html").read_text())
    assert "What was imported" in text and all(x in text for x in t["format recognised"])
