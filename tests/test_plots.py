"""Figures: Japanese labels render with a real CJK font (no missing-glyph boxes)."""

from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from servelab.report import plots  # noqa: E402


def _summary() -> pd.DataFrame:
    rows = []
    for c in (1, 4):
        for p in (32, 512):
            rows.append({"config": "基準", "bucket": f"in{p}", "concurrency": c, "prompt_tokens": p,
                         "ttft_p50_s": 0.01 * p / c, "ttft_p95_s": 0.012 * p / c, "e2e_p95_s": 1.0,
                         "aggregate_output_tps": 100.0 * c, "aggregate_output_tps_min": 90.0 * c,
                         "aggregate_output_tps_max": 110.0 * c, "decode_tps_p50": 100.0 / c})
    return pd.DataFrame(rows)


def test_japanese_figures_use_a_cjk_font_without_missing_glyphs():
    font = plots.use_language("ja")
    assert font and "CJK" in font
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = plots.ttft_vs_prompt_tokens(_summary(), {"基準": "基準構成（日本語）"}, title="入力長とTTFT")
        fig.canvas.draw()
    assert not [w for w in caught if "missing from" in str(w.message)]
    plt.close(fig)
    plots.use_language("en")
    with warnings.catch_warnings(record=True) as caught:  # the contrast: DejaVu has no kana
        warnings.simplefilter("always")
        fig = plots.ttft_vs_prompt_tokens(_summary(), title="入力長とTTFT")
        fig.canvas.draw()
    assert [w for w in caught if "missing from" in str(w.message)]
    plt.close(fig)
