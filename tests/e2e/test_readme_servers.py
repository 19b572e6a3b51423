"""The README's commands that start a server, executed as a new user types them, each line in order from
the repository root, runs and reports in a temporary folder: vLLM's CPU build started detached by
`servelab serve` and measured by `servelab bench URL --html` (a page that passes the report lint),
and servelab's reference server for `calibrate`. (A study's own run, `servelab run`, is tests/e2e/test_pipeline.py's.)"""

from __future__ import annotations

import json
import subprocess

import pytest
from paths import ROOT
from readme import block, environment, run_lines

from servelab.report.lint import lint_html

pytestmark = pytest.mark.engine


def test_the_commands_that_start_a_server_work_as_written(tmp_path):
    lines = block("readme-servers")
    assert any(ln.startswith("servelab bench http") and "--html" in ln for ln in lines)
    assert any(ln.startswith("servelab calibrate") for ln in lines)
    serve = next(ln.split("#")[0].strip() for ln in lines if ln.startswith("servelab serve") and "--stop" not in ln)
    env = environment(tmp_path)
    try:
        run_lines(lines, env)  # every line must exit 0
    finally:  # a line that failed leaves no engine behind
        subprocess.run(["bash", "-c", f"{serve} --stop"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    pages = sorted(str(p.relative_to(tmp_path / "reports")) for p in (tmp_path / "reports").rglob("index*.html"))
    bench = [p for p in pages if p.startswith("bench-")]
    # the bench page and the list of studies (environment() removed the committed ones)
    assert len(bench) == 1 and pages == sorted([*bench, "index.html"])
    assert lint_html(tmp_path / "reports" / bench[0]) == []
    bench_run = json.loads((tmp_path / "runs" / bench[0].split("/")[0] / "server" / "run.json").read_text())
    assert bench_run["status"] == "complete" and bench_run["headline"]["success_rate"] == 1.0
    assert bench_run["server"]["mode"] == "attached" and bench_run["server"]["version"]
