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

from browser import check_in_browser

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
    res = check_in_browser(tmp_path / "local-cpu-ja" / "index.html")
    assert res["images"] >= 5 and res["broken_images"] == 0 and res["errors"] == []


def test_h200_tp2_is_charged_two_gpus_and_compared_with_one_gpu():
    """TP=2 spans two GPUs: the cost rows charge 2/8 of the p5en.48xlarge, the roofline uses two
    H200s' bandwidth, and the report compares it with the one-GPU CUDA-graph configuration."""
    from servelab import report

    sd = report.load_study_data(ROOT / "reports" / "h200-llama8b-vllm")
    assert report.baselines(sd)["tp2"] == "cudagraph"
    assert report.baselines(sd)["tp2-saturation"] == "cudagraph-saturation"
    text, t = report.cost_section(sd)
    assert "2/8 GPUs = $15.8240/h (tp2, tp2-saturation)" in text and "1/8 GPUs = $7.9120/h (eager" in text
    t = t.reset_index(drop=True)
    for cid, hourly in (("cudagraph", 63.296 / 8), ("tp2", 63.296 * 2 / 8)):
        r = t[t["config"] == cid].iloc[0]
        assert r["self-host $/month"] == pytest.approx(hourly * 730, abs=0.01)
        assert r["self-host $/1M out"] == pytest.approx(hourly / (r["agg tok/s"] * 3600) * 1e6, rel=1e-3)
    _, eff = report.roofline_table(sd)
    tp2 = eff[eff["config"] == "tp2"]
    assert set(tp2["hardware"]) == {"2 x H200 SXM"}
    one = eff[eff["config"] == "cudagraph"]
    assert set(one["hardware"]) == {"H200 SXM"}
    # the bound halves with twice the bandwidth: bound x 2 is the one-GPU bound of the same level
    m = tp2.merge(one, on=["bucket", "concurrency"], suffixes=("_2", "_1"))
    assert len(m) == 9
    assert (m["decode_bound_s_per_token_2"] * 2).tolist() == pytest.approx(m["decode_bound_s_per_token_1"].tolist())
