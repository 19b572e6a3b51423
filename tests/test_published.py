"""Published reports re-render from their committed data alone (no server, no GPU) and the
re-rendered tables match the committed HTML's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = sorted(p.parent.parent.name for p in (ROOT / "reports").glob("*/data/study.json"))
pytestmark = pytest.mark.notebooks


def tables(html: str) -> list[str]:
    return [re.sub(r"\s+", " ", t) for t in re.findall(r"<table.*?</table>", html, flags=re.S)]


@pytest.mark.parametrize("study", PUBLISHED)
def test_rerender_matches_committed(study, tmp_path):
    shutil.copytree(ROOT / "reports" / study, tmp_path / study)
    (tmp_path / study / "index.html").unlink()
    env = {**os.environ, "SERVELAB_REPORTS": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "report", study], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    new = (tmp_path / study / "index.html").read_text()
    old = (ROOT / "reports" / study / "index.html").read_text()
    assert len(tables(new)) >= 10
    assert tables(new) == tables(old)


def test_both_studies_are_published():
    assert {"local-cpu", "h200-llama8b-vllm"} <= set(PUBLISHED)


def test_japanese_report_renders(tmp_path):
    """language: ja -> Japanese headings and prose, figures with a CJK font, opens in Chromium."""
    import json

    from servelab import report

    shutil.copytree(ROOT / "reports" / "local-cpu", tmp_path / "local-cpu-ja")
    sj = tmp_path / "local-cpu-ja" / "data" / "study.json"
    d = json.loads(sj.read_text())
    d["study"]["language"] = "ja"
    sj.write_text(json.dumps(d, ensure_ascii=False))
    env = {**os.environ, "SERVELAB_REPORTS": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "report", "local-cpu-ja"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    html = (tmp_path / "local-cpu-ja" / "index.html").read_text()
    assert "測定方法" in html and "段階別の性能推移" in html and "合計スループット最大" in html
    res = report.check_in_browser(tmp_path / "local-cpu-ja" / "index.html")
    assert res["images"] >= 5 and res["broken_images"] == 0 and res["errors"] == []
