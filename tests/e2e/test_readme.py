"""The README's commands, executed as a new user types them (after `make test`'s set-up): the
"Using it" block and the papermill block, each line in order, from the repository root. Runs and
reports go to temporary folders, so the committed reports stay untouched."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from paths import ROOT

pytestmark = [pytest.mark.engine, pytest.mark.notebooks]


def block(marker: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)```", text, re.S)
    assert m, f"README has no {marker} block"
    return [ln.strip() for ln in m.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def run_lines(lines: list[str], env: dict[str, str], timeout: int = 900) -> None:
    for line in lines:
        if line.startswith(". .venv/bin/activate"):
            continue  # done through PATH below
        r = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"README command failed: {line}\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}"


@pytest.fixture
def env(tmp_path):
    shutil.copytree(ROOT / "reports", tmp_path / "reports")
    return {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "SERVELAB_RUNS": str(tmp_path / "runs"), "SERVELAB_REPORTS": str(tmp_path / "reports")}


def test_the_using_it_commands_work_as_written(env, tmp_path):
    lines = block("readme-commands")
    assert any("--reduced" in ln and "--force" in ln for ln in lines) and any("--dry-run" in ln for ln in lines)
    committed = {s: (ROOT / "reports" / s / "index.html").read_bytes() for s in ("local-cpu", "local-cpu-kv")
                 if (ROOT / "reports" / s / "index.html").exists()}  # the default: once `make report` published it
    assert "local-cpu-kv" in committed
    run_lines(lines, env)
    for study, page in committed.items():  # re-rendered (report --all), unchanged
        assert (tmp_path / "reports" / study / "index.html").read_bytes() == page
    run = (tmp_path / "runs" / "local-cpu-kv" / "roomy" / "run.json").read_text()
    assert '"status": "complete"' in run


def test_the_papermill_commands_work_as_written(env):
    lines = block("readme-papermill")
    assert sum("papermill" in ln for ln in lines) >= 2 and any(ln.startswith("for study in") for ln in lines)
    for p in (ROOT / "runs" / "papermill").glob("*.ipynb"):
        p.unlink()
    run_lines(lines, env)
    out = ROOT / "runs" / "papermill"
    assert {p.name for p in out.glob("writeup-*.ipynb")} == {"writeup-local-cpu-kv.ipynb", "writeup-h200-llama8b-vllm.ipynb"}
    assert "kv-tight" in (out / "04_kv-tight.ipynb").read_text()
