"""The README's "Using it" commands that start a server (vLLM's CPU build for one configuration
of the KV study at its reduced size, servelab's reference server for `calibrate`), executed as a
new user types them, each line in order from the repository root; runs go to a temporary folder."""

from __future__ import annotations

import json

import pytest
from readme import block, environment, run_lines

pytestmark = pytest.mark.engine


def test_the_commands_that_start_a_server_work_as_written(tmp_path):
    lines = block("readme-servers")
    assert any(ln.startswith("servelab run") and "--reduced" in ln and "--no-report" in ln for ln in lines)
    assert any(ln.startswith("servelab calibrate") for ln in lines)
    env = environment(tmp_path)
    run_lines(lines, env)  # every line must exit 0
    run = json.loads((tmp_path / "runs" / "local-cpu-kv" / "roomy" / "run.json").read_text())
    assert run["status"] == "complete" and run["headline"]["success_rate"] == 1.0
    pages = sorted(p.name for p in (tmp_path / "reports").rglob("index*.html"))
    assert pages == []  # --no-report: no page written (environment() removed the committed ones)
