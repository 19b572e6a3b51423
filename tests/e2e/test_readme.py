"""The README's commands, executed as a new user types them (after `make test`'s set-up): the
"Using it" block and the papermill block, each line in order, from the repository root. Runs and
reports go to temporary folders, so the committed reports stay untouched."""

from __future__ import annotations

import pytest
from paths import ROOT
from readme import REPORT_ALL, block, environment, run_lines

pytestmark = [pytest.mark.engine, pytest.mark.notebooks, pytest.mark.xdist_group("readme")]


def test_the_using_it_commands_work_as_written(readme_commands):
    lines = block("readme-commands")
    assert any("--reduced" in ln and "--force" in ln for ln in lines) and any("--dry-run" in ln for ln in lines)
    assert any(ln.startswith(REPORT_ALL) for ln in lines) and any(ln.startswith("servelab report local-cpu-kv")
                                                                  for ln in lines)
    base, after = readme_commands  # every line exited 0 (the fixture checks each)
    page = "local-cpu-kv/index.html"
    committed = (ROOT / "reports" / page).read_bytes()
    # rendered twice, in two processes (alone, then beside the other studies): the same bytes, the committed page
    assert after["servelab report local-cpu-kv"][page] == after[REPORT_ALL][page] == committed
    assert set(after[REPORT_ALL]) >= {page, "index.html", "local-cpu-kv/index.ja.html"}
    run = (base / "runs" / "local-cpu-kv" / "roomy" / "run.json").read_text()
    assert '"status": "complete"' in run


def test_the_papermill_commands_work_as_written(tmp_path):
    lines = block("readme-papermill")
    assert sum("papermill" in ln for ln in lines) >= 2 and any(ln.startswith("for study in") for ln in lines)
    for p in (ROOT / "runs" / "papermill").glob("*.ipynb"):
        p.unlink()
    run_lines(lines, environment(tmp_path))
    out = ROOT / "runs" / "papermill"
    assert {p.name for p in out.glob("writeup-*.ipynb")} == {"writeup-local-cpu-kv.ipynb", "writeup-h200-llama8b-vllm.ipynb"}
    assert "kv-tight" in (out / "04_kv-tight.ipynb").read_text()
