"""Published reports: they re-render from their committed data alone, byte for byte
(tests/e2e/test_readme.py, beside the README run that renders them); the page lint
finds nothing (no NaN/None/'rows ×'/'…' cells, no scientific notation, no index column, every
table and figure captioned, no external resource); every image loads in Chromium; the default
study publishes English and Japanese pages linked to each other."""

from __future__ import annotations

import pytest

from browser import check_in_browser
from servelab.report.lint import lint_html
from paths import ROOT

PUBLISHED = sorted(p.parent.parent.name for p in (ROOT / "reports").glob("*/data/study.json"))
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "reports").glob("*/index*.html"))
pytestmark = pytest.mark.notebooks


def test_both_studies_are_published():
    assert {"local-cpu-kv", "h200-llama8b-vllm"} <= set(PUBLISHED)


def test_default_study_is_published():
    if "local-cpu" not in PUBLISHED:
        pytest.skip("the real-model default study (params/local-cpu.yaml) is not published yet: `make report`")
    assert (ROOT / "reports" / "local-cpu" / "data" / "eager" / "quality.json").exists()


@pytest.mark.parametrize("page", PAGES)
def test_published_page_passes_the_lint(page):
    assert lint_html(ROOT / page) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_image_loads_offline_in_chromium(page):
    res = check_in_browser(ROOT / page)
    assert res["images"] >= 5 and res["broken_images"] == 0
    assert res["external_requests"] == [] and res["console_errors"] == [] and res["errors"] == []


@pytest.mark.parametrize("study", ["local-cpu", "local-cpu-kv"])
def test_cpu_studies_publish_english_and_japanese_linked(study):
    if study not in PUBLISHED:
        pytest.skip(f"{study} is not published yet: `make report`")
    en = (ROOT / "reports" / study / "index.html").read_text()
    ja = (ROOT / "reports" / study / "index.ja.html").read_text()
    assert '<html lang="en"' in en and '<html lang="ja"' in ja
    assert 'href="index.ja.html"' in en and 'href="index.html"' in ja
    for heading in ("結論", "測定方法", "段階別の性能推移", "診断", "再現性の記録"):
        assert heading in ja
    for english_heading in ("What we found", "How it was measured", "One change at a time"):
        assert english_heading not in ja  # the Japanese page does not fall back to English headings


def test_h200_tp2_is_charged_two_gpus_and_compared_with_one_gpu():
    """TP=2 spans two GPUs: the cost rows charge 2/8 of the p5en.48xlarge, the roofline uses two
    H200s' bandwidth, and the report compares it with the one-GPU CUDA-graph configuration."""
    from servelab.report import baselines, load_study_data
    from servelab.report import diagnosis as dg
    from servelab.report import money

    sd = load_study_data(ROOT / "reports" / "h200-llama8b-vllm")
    assert baselines(sd)["tp2"] == "cudagraph"
    assert baselines(sd)["tp2-saturation"] == "cudagraph-saturation"
    t, kind = money.cost_rows(sd)
    assert kind == "instance"
    for cid, hourly, share in (("cudagraph", 63.296 / 8, "1/8 GPUs"), ("tp2", 63.296 * 2 / 8, "2/8 GPUs")):
        r = t[t["config"] == cid].iloc[0]
        assert r["gpu_share"] == share
        assert r["selfhost_monthly_usd"] == pytest.approx(hourly * 730, abs=0.01)
        assert r["usd_per_m_output"] == pytest.approx(hourly / (r["aggregate_output_tps"] * 3600) * 1e6, rel=1e-3)
    eff = dg.roofline(sd)
    tp2, one = eff[eff["config"] == "tp2"], eff[eff["config"] == "cudagraph"]
    assert set(tp2["hardware"]) == {"2 x H200 SXM"} and set(one["hardware"]) == {"H200 SXM"}
    # the bound halves with twice the bandwidth: bound x 2 is the one-GPU bound of the same level
    m = tp2.merge(one, on=["bucket", "concurrency"], suffixes=("_2", "_1"))
    assert len(m) == 9
    assert (m["decode_bound_s_per_token_2"] * 2).tolist() == pytest.approx(m["decode_bound_s_per_token_1"].tolist())


MACHINE_PATH = __import__("re").compile(r"(?<![\w.$~])/(?:tmp|work|root|home|opt)/[\w.-]+")


def test_no_path_of_the_machine_that_ran_a_study_is_published():
    """Published pages and run files carry relative paths and placeholders ($SERVELAB_CACHE,
    $SITE_PACKAGES, $TMPDIR, ~), never the clone's folder, a temp or home folder or an install folder."""
    found = {}
    for p in sorted((ROOT / "reports").rglob("*")):
        if not p.is_file() or p.suffix in (".png", ".gz"):
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        hits = MACHINE_PATH.findall(text)
        if hits:
            found[str(p.relative_to(ROOT))] = sorted(set(hits))[:3]
    assert found == {}


def test_the_readme_picture_is_the_default_pages_first_screen():
    """docs/img/local-cpu.png is what scripts/readme_screenshot.py takes of the committed page, byte for byte
    (a fixed viewport, the page's fonts, nothing on the first screen that changes from render to render)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_screenshot.py"), "--check"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
