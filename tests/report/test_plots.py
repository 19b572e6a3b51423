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
        fig = plots.ttft_vs_prompt_tokens(_summary(), {"基準": "基準構成（日本語）"}, lang="ja")
        fig.canvas.draw()
    assert not [w for w in caught if "missing from" in str(w.message)]
    plt.close(fig)
    plots.use_language("en")
    with warnings.catch_warnings(record=True) as caught:  # the contrast: DejaVu has no kana
        warnings.simplefilter("always")
        fig = plots.ttft_vs_prompt_tokens(_summary(), lang="ja")
        fig.canvas.draw()
    assert [w for w in caught if "missing from" in str(w.message)]
    plt.close(fig)


def test_one_colour_per_configuration_and_legend_outside_the_axes():
    s = pd.concat([_summary(), _summary().assign(config="b")])
    colors = plots.config_colors(["基準", "b"])
    fig = plots.throughput_vs_concurrency(s, colors=colors)
    lines = {tuple(round(x, 3) for x in matplotlib.colors.to_rgb(c.get_color())) for ax in fig.axes
             for c in ax.get_lines() if c.get_marker() == "o"}
    assert lines == {tuple(round(x, 3) for x in matplotlib.colors.to_rgb(c)) for c in colors.values()}
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    for ax in fig.axes:  # the legend sits below every panel, never on the data
        assert legend.y1 <= ax.get_window_extent().y0
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "4"]
    plt.close(fig)


def test_pareto_frontier_keeps_only_undominated_points():
    pts = pd.DataFrame({"x": [1, 2, 3, 2.5], "y": [9, 8, 1, 4]})
    f = plots.pareto_frontier(pts, "x", "y")
    assert f[["x", "y"]].values.tolist() == [[1, 9], [2, 8], [2.5, 4], [3, 1]]
    dominated = pd.concat([pts, pd.DataFrame({"x": [1.5], "y": [7]})])
    assert len(plots.pareto_frontier(dominated, "x", "y")) == 4
