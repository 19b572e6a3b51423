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


def _points() -> pd.DataFrame:
    rows = []
    for cfg, aa, eff, verdict in (("compiled", False, 0.15, "faster"), ("ngram", False, 4.2, "faster"),
                                  ("budget", False, -0.01, "no detectable change"),
                                  ("eager-again", True, 0.004, "no detectable change")):
        for panel in ("decode_tps_steady", "aggregate_output_tps"):
            for b in ("rewrite", "code"):
                rows.append({"config": cfg, "baseline": "eager", "aa": aa, "panel": panel, "bucket": b,
                             "concurrency": 1 if panel == "decode_tps_steady" else 4, "effect": eff,
                             "lo": eff - 0.03, "hi": eff + 0.03, "verdict": verdict})
    return pd.DataFrame(rows)


def test_the_opening_figure_has_a_row_per_comparison_and_marks_what_was_told_apart():
    pts = _points()
    fig = plots.change_vs_configuration(pts, {"compiled": "compiled (torch.compile)", "eager-again": "eager again"})
    fig.canvas.draw()
    dec, agg = fig.axes[:2]
    assert [t.get_text() for t in dec.get_yticklabels()] == ["compiled (torch.compile)", "ngram", "budget",
                                                             "eager again (A/A)"]
    assert dec.get_yticklabels()[3].get_color() == "dimgrey"  # the A/A pair, apart from the changes
    assert "1 request in flight" in dec.get_title() and "4 requests in flight" in agg.get_title()
    markers = [ln for ln in dec.get_lines() if ln.get_marker() in ("o", "s")]
    filled = [ln.get_markerfacecolor() != "white" for ln in markers]
    assert filled == [True, True, True, True, False, False, False, False]  # compiled, ngram found; budget, A/A not
    # a log axis of the ratio labelled in percent: 0 at ratio 1, and +420 % reaches the axis
    ticks = dict(zip([t.get_text() for t in dec.get_xticklabels()], dec.get_xticks()))
    assert ticks["0"] == 1.0 and dec.get_xscale() == "log" and dec.get_xlim()[1] > 5.2
    assert {t.get_text() for t in dec.texts} == {"+15 %", "+420 %"}  # the number beside each found change
    plt.close(fig)


def test_the_opening_figure_drops_a_panel_without_points():
    pts = _points()
    plots.use_language("ja")
    fig = plots.change_vs_configuration(pts[pts["panel"] == "aggregate_output_tps"], lang="ja")
    plots.use_language("en")
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == "合計出力 tok/s（並列数 4）"
    plt.close(fig)
