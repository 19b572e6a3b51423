"""The README's command blocks, run as a new user types them (a test helper: tests/e2e/test_readme.py
and the published-page checks use the session's one run of the blocks that need no server)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from paths import ROOT

REPORT_ALL = "servelab report --all"


def block(marker: str) -> list[str]:
    """The command lines of every README block under `<!-- marker -->`, in document order (a section per
    journey has its own block; those of one marker run as one sequence)."""
    text = (ROOT / "README.md").read_text()
    found = re.findall(rf"<!-- {marker} -->\s*```bash\n(.*?)```", text, re.S)
    assert found, f"README has no {marker} block"
    return [ln.strip() for b in found for ln in b.splitlines() if ln.strip() and not ln.startswith("#")]


def environment(base: Path) -> dict[str, str]:
    """The venv on PATH (as `. .venv/bin/activate` does), runs and reports in `base`: the
    committed reports copied there without their pages, so every page found afterwards was
    rendered by the commands."""
    shutil.copytree(ROOT / "reports", base / "reports")
    for page in (base / "reports").rglob("index*.html"):
        page.unlink()
    return {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "SERVELAB_RUNS": str(base / "runs"), "SERVELAB_REPORTS": str(base / "reports")}


def pages(reports: Path) -> dict[str, bytes]:
    return {str(p.relative_to(reports)): p.read_bytes() for p in sorted(reports.rglob("index*.html"))}


def run_lines(lines: list[str], env: dict[str, str], timeout: int = 900) -> dict[str, dict[str, bytes]]:
    """Each line in order from the repository root; every one must exit 0. Returns, after each
    `servelab report` line, the pages then under SERVELAB_REPORTS (by line)."""
    after: dict[str, dict[str, bytes]] = {}
    for line in lines:
        if line.startswith(". .venv/bin/activate"):
            continue  # done through PATH
        r = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"README command failed: {line}\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}"
        command = line.split("#")[0].strip()
        if command.startswith("servelab report"):
            after[command] = pages(Path(env["SERVELAB_REPORTS"]))
    return after
