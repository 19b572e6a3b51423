"""The reading template, presentation primitives and page lint (lib/servelab/report/{render,html,lint}.py).

Fast (no kernel, no server): the notebook is built with nbformat with outputs filled in directly,
as papermill would leave them. The modules are loaded by file path, so these tests run whether
or not lib/servelab/report/ is a package yet.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from paths import ROOT

REPORT_DIR = ROOT / "lib" / "servelab" / "report"
CHROMIUM = Path("/usr/bin/chromium")


def _load(name: str):
    modname = f"servelab_report_{name}"  # the name html.py's fallback import uses for render.py
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, REPORT_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


render = _load("render")
rhtml = _load("html")
lint = _load("lint")


# -- the test notebook --------------------------------------------------------------------

def _df() -> pd.DataFrame:
    return pd.DataFrame({
        "configuration": ["roomy", "kv-tight", "spec-decode"],
        "TTFT p50 (ms)": [688.385964, 12.345, np.nan],
        "bytes moved": [3517098000.0, 1.5e6, 2.0],
        "Δ %": [0.0, -38.94, 17.2],
        "launch command": [("vllm serve /models/tiny --max-model-len 4096 --block-size 32 --kv-cache-memory-bytes 256M "
                            "--enforce-eager --dtype bfloat16"), "vllm serve", None],
    })


def _figure():
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([32, 512, 2048], [29, 106, 525], marker="o", label="roomy")
    ax.plot([32, 512, 2048], [23, 103, 521], marker="o", label="kv-tight")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _display(obj) -> dict:
    return new_output("display_data", data={"text/html": obj.data, "text/plain": "<IPython.core.display.HTML object>"})


def _notebook(run: str = "a") -> nbformat.NotebookNode:
    """An executed write-up, with what differs between two executions: random cell ids and
    papermill / execution timestamps."""
    nb = new_notebook()
    t = rhtml.table(_df(), "Table 1. Time to first token by configuration",
                    formats={"Δ %": "{:+.1f}"}, notes={"–": "not measured at this level"})
    f = rhtml.figure(_figure(), "Figure 1. TTFT grows linearly with prompt length.")
    nb.cells = [
        new_markdown_cell("# vLLM on CPU: a too-small KV cache\n\nSame engine, model and workload; the second "
                          "configuration caps the KV cache at 136 blocks of 32 tokens. Token SECRET-TOKEN-123."),
        new_code_cell("html.table(df, ...)", outputs=[_display(t)], execution_count=3),
        new_code_cell("html.figure(fig, ...)", outputs=[_display(f)], execution_count=4),
        new_code_cell("html.card(...)", outputs=[_display(rhtml.card("roomy", {"engine": "vLLM 0.32.0",
                                                                             "KV cache tokens": 65536.0}))]),
        new_code_cell("html.details(...)", outputs=[_display(rhtml.details("launch command", "vllm serve x " * 20))]),
    ]
    stamp = {"a": "2026-11-30T10:00:00.000001", "b": "2026-12-01T08:31:17.424242"}[run]
    nb.metadata["papermill"] = {"start_time": stamp, "end_time": stamp, "duration": 12.5 if run == "a" else 9.1,
                                "input_path": f"/tmp/{run}/05_writeup.ipynb", "parameters": {"study_dir": "x"}}
    for c in nb.cells:
        c["id"] = uuid.uuid4().hex[:8]
        c.metadata["papermill"] = {"start_time": stamp, "end_time": stamp, "duration": 0.1, "status": "completed",
                                   "exception": False}
        c.metadata["execution"] = {"iopub.execute_input": stamp, "iopub.status.idle": stamp}
    return nb


def _scrub(s: str) -> str:
    return s.replace("SECRET-TOKEN-123", "***")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("page") / "index.html"
    return render.notebook_to_html(_notebook("a"), out, title="servelab test page", scrub=_scrub)


# -- render ---------------------------------------------------------------------------------

def test_render_is_deterministic(page, tmp_path):
    again = render.notebook_to_html(_notebook("b"), tmp_path / "index.html", title="servelab test page", scrub=_scrub)
    assert page.read_bytes() == again.read_bytes()
    nb_file = tmp_path / "nb.ipynb"  # from a file, too
    nbformat.write(_notebook("b"), str(nb_file))
    third = render.notebook_to_html(nb_file, tmp_path / "third.html", title="servelab test page", scrub=_scrub)
    assert third.read_bytes() == page.read_bytes()


def test_page_has_no_external_resources(page):
    text = page.read_text(encoding="utf-8")
    low = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:", text).lower()  # base64 may spell "cdn"
    assert "<script" not in low
    for bad in ("cdn", "require.js", "requirejs", "mathjax", "@import", "fonts.googleapis"):
        assert bad not in low, bad
    for tag, attr, url in re.findall(r"<(script|link|img)\b[^>]*?\b(src|href)=[\"']([^\"']*)", text, flags=re.IGNORECASE):
        assert not re.match(r"(https?:)?//", url), (tag, attr, url)
    assert not list(page.parent.glob("*.png")), "images must be embedded"
    assert 'src="data:image/png;base64,' in text


def test_page_content(page):
    text = page.read_text(encoding="utf-8")
    assert '<html lang="en">' in text
    assert "<title>servelab test page</title>" in text
    assert "SECRET-TOKEN-123" not in text and "***" in text  # scrub applied
    assert "html.table(df" not in text and "In&nbsp;[" not in text and "Out[" not in text  # no code, no prompts
    assert "jp-InputArea" not in text and "cell-id=" not in text
    assert "<figcaption>Figure 1. TTFT grows linearly with prompt length.</figcaption>" in text
    assert "<caption>Table 1. Time to first token by configuration</caption>" in text
    assert "font-variant-numeric: tabular-nums" in text and "@media print" in text and "Noto Sans CJK JP" in text


def test_language_and_alternate_link(tmp_path):
    nb = _notebook()
    out = render.notebook_to_html(nb, tmp_path / "index.html", title="t", language="ja",
                                  alternate={"href": "index.en.html", "label": "English", "lang": "en"})
    text = out.read_text(encoding="utf-8")
    assert '<html lang="ja">' in text
    body = text.split("<body>", 1)[1]
    assert body.index('href="index.en.html"') < body.index("<h1")  # at the top
    assert ">English</a>" in body
    # from metadata when not passed
    nb.metadata["servelab"] = {"language": "ja", "alternate": {"href": "index.html", "label": "English"}}
    text = render.notebook_to_html(nb, tmp_path / "m.html", title="t").read_text(encoding="utf-8")
    assert '<html lang="ja">' in text and 'href="index.html"' in text
    assert '<html lang="en">' in render.notebook_to_html(_notebook(), tmp_path / "e.html", title="t").read_text()


def test_run_dependent_outputs_are_normalised(tmp_path):
    def nb(addr: str, styler_uuid: str):
        n = _notebook()
        sty = pd.DataFrame({"a": [1.5]}).style.set_uuid(styler_uuid).format("{:.1f}").to_html()
        n.cells.append(new_code_cell("ax.plot(x)", outputs=[
            new_output("execute_result", data={"text/plain": f"[<matplotlib.lines.Line2D at {addr}>]"}, execution_count=7),
            new_output("display_data", data={"text/html": sty, "text/plain": "styler"})]))
        return n
    a = render.notebook_to_html(nb("0x7f2490f2c650", "a1b2c"), tmp_path / "a.html", title="t").read_bytes()
    b = render.notebook_to_html(nb("0x7f5a931abb90", "9f8e7"), tmp_path / "b.html", title="t").read_bytes()
    assert a == b
    assert b"Line2D" not in a and b"T_s0" in a and b"a1b2c" not in a


def test_scrub_skips_image_payloads():
    page = '<p>key abcdef1</p><img src="data:image/png;base64,xxabcdef1yy=">'
    assert render.scrub_text(page, lambda s: s.replace("abcdef1", "***")) == (
        '<p>key ***</p><img src="data:image/png;base64,xxabcdef1yy=">')


def test_figure_png_is_deterministic():
    fig = _figure()
    a, b = render.figure_png(fig), render.figure_png(fig)
    plt.close(fig)
    assert a == b
    assert a.startswith(b"\x89PNG") and b"Software" not in a and b"Matplotlib" not in a
    fig2 = _figure()  # the same figure built again
    assert render.figure_png(fig2) == a
    plt.close(fig2)


def test_figure_closes_and_embeds():
    fig = _figure()
    h = rhtml.figure(fig, "A <caption> & more")
    assert not plt.fignum_exists(fig.number)
    assert h.data.startswith('<figure class="sl-figure"><img src="data:image/png;base64,')
    assert 'alt="A &lt;caption&gt; &amp; more"' in h.data
    assert "<figcaption>A &lt;caption&gt; &amp; more</figcaption></figure>" in h.data


# -- table ----------------------------------------------------------------------------------

def _cells(h) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", h.data)]


def test_table_number_formats():
    df = pd.DataFrame({"a": [688.385964, 3517098000.0, 12.345, np.nan, 3.14159, 0.012345]})
    h = rhtml.table(df, "numbers", notes={"–": "not measured at this level"})
    assert _cells(h) == ["688", "3,517,098,000", "12.3", "–a", "3.14", "0.0123"]
    assert '<td class="num missing">–<sup class="fn">a</sup></td>' in h.data
    assert '<sup class="fn">a</sup></span> – not measured at this level' in h.data
    assert '<p class="sl-table-notes">' in h.data
    assert lint.lint_text(h.data) == []


def test_quotations_are_marked_english_on_a_japanese_page_only():
    msg = "ValueError: To serve at least one request with the model's max seq len (4096) <x>"
    df = pd.DataFrame({"why": [rhtml.quote_cell(msg, "ja")], "en": [rhtml.quote_cell(msg, "en")]})
    h = rhtml.table(df, "quoted")
    tds = re.findall(r"<td[^>]*>(.*?)</td>", h.data)
    assert tds[0].startswith('<span lang="en">ValueError: To serve') and tds[0].endswith("&lt;x&gt;</span>")
    assert "lang=" not in tds[1] and "&lt;x&gt;" in tds[1]  # an English page: as is
    assert rhtml.quote_md("p5en $63.30/h", "ja") == '<span lang="en">p5en $63.30/h</span>'
    assert rhtml.quote_md("p5en $63.30/h", "en") == "p5en $63.30/h" and rhtml.quote_md(None, "ja") is None


def test_table_formats_override_and_no_index():
    df = pd.DataFrame({"TTFT p50 (ms)": [29.4, 1304.0], "Δ %": [17.2, -38.94], "n": [1.0, 16.0]})
    h = rhtml.table(df, "c", formats={"TTFT p50 (ms)": "{:,.0f}", "Δ %": "{:+.1f}"})
    assert _cells(h) == ["29", "+17.2", "1", "1,304", "-38.9", "16"]  # row by row
    assert "<th" not in h.data.split("<tbody>")[1]  # no index column
    assert h.data.count('class="num"') == 3 + 6


def test_table_named_index_becomes_columns_and_multiindex_headers():
    cols = pd.MultiIndex.from_tuples([(1, "TTFT p50 (ms)"), (1, "tok/s"), (4, "TTFT p50 (ms)"), (4, "tok/s")],
                                     names=["concurrency", ""])
    df = pd.DataFrame([[29.0, 121.4, 31.2, 480.0], [525.3, 80.9, 1803.0, 175.5]], columns=cols,
                      index=pd.Index([32, 2048], name="input tokens"))
    h = rhtml.table(df, "seed table", formats={"TTFT p50 (ms)": "{:,.0f}"})
    assert '<th rowspan="2" scope="col" class="num">input tokens</th>' in h.data
    assert '<th colspan="2" scope="colgroup">concurrency 4</th>' in h.data
    assert _cells(h) == ["32", "29", "121", "31", "480", "2,048", "525", "80.9", "1,803", "176"]
    assert lint.lint_text(h.data) == []


def test_table_escapes_and_never_truncates():
    long = "vllm serve <model> --flag " + "x" * 300
    df = pd.DataFrame({"k": [f"row {i}" for i in range(120)], "v": [long] * 120})
    for j in range(40):
        df[f"c{j}"] = np.arange(120) * 1.5
    h = rhtml.table(df, "big")
    assert h.data.count("<tr>") == 121
    assert "&lt;model&gt;" in h.data and "<model>" not in h.data and ("x" * 300) in h.data
    assert "..." not in h.data and "…" not in h.data and "rows ×" not in h.data
    assert lint.lint_text(h.data) == []


def test_details_and_card():
    d = rhtml.details("cmd <1>", "a < b\nline 2")
    assert d.data == "<details><summary>cmd &lt;1&gt;</summary><pre>a &lt; b\nline 2</pre></details>"
    c = rhtml.card("roomy", {"KV tokens": 65536, "rate": 0.5, "gone": None})
    assert c.data == ('<section class="sl-card"><h4>roomy</h4><dl><dt>KV tokens</dt><dd>65,536</dd>'
                      "<dt>rate</dt><dd>0.500</dd><dt>gone</dt><dd>–</dd></dl></section>")


# -- lint -----------------------------------------------------------------------------------

def test_lint_clean_page(page):
    assert lint.lint_html(page) == []


def _t(cell: str) -> str:
    return f"<table><caption>c</caption><thead><tr><th>a</th></tr></thead><tbody><tr><td>{cell}</td></tr></tbody></table>"


@pytest.mark.parametrize("cell,token", [("NaN", "NaN"), ("None", "None"), ("nan", "nan"),
                                        ("20 rows × 5 columns", "rows ×"), ("abc...", "..."), ("abc…", "…")])
def test_lint_bad_tokens(cell, token):
    assert lint.lint_text(_t(cell)) == [f"table 1: cell {cell!r} contains {token!r}"]


def test_lint_tokens_are_words():
    assert lint.lint_text(_t("banana nano Nonesuch")) == []


@pytest.mark.parametrize("cell", ["3.517098e+09", "1e-05", "6.0E3"])
def test_lint_scientific_notation(cell):
    assert lint.lint_text(_t(cell)) == [f"table 1: cell {cell!r} uses scientific notation"]


def test_lint_scientific_ignores_hashes_and_names():
    assert lint.lint_text(_t("3e5f9c1 llama-3e8 v1.2e")) == []


def test_lint_table_without_caption():
    assert lint.lint_text("<table><tr><td>1</td></tr></table>") == ["table 1: no <caption>"]


def test_lint_img_outside_figure():
    img = '<img src="data:image/png;base64,iVBORw0KGgo=" alt="x">'
    assert lint.lint_text(f"<p>{img}</p>") == ["img 1: not inside a <figure> with a <figcaption>"]
    assert lint.lint_text(f"<figure>{img}</figure>") == ["img 1: not inside a <figure> with a <figcaption>"]
    assert lint.lint_text(f"<figure>{img}<figcaption>c</figcaption></figure>") == []


def test_lint_img_not_embedded():
    page = '<figure><img src="plot.png" alt="x"><figcaption>c</figcaption></figure>'
    assert lint.lint_text(page) == ["img 1: src is not a data: URI ('plot.png')"]


def test_lint_index_column():
    page = ("<table><caption>c</caption><thead><tr><th>i</th><th>a</th></tr></thead><tbody>"
            "<tr><th>0</th><td>x</td></tr><tr><th>1</th><td>y</td></tr><tr><th>2</th><td>z</td></tr></tbody></table>")
    assert lint.lint_text(page) == ["table 1: index column (first column is <th> 0..2)"]


def test_lint_empty_top_left_header():
    page = ("<table><caption>c</caption><thead><tr><th></th><th>a</th></tr></thead><tbody>"
            "<tr><th>roomy</th><td>x</td></tr></tbody></table>")
    assert lint.lint_text(page) == ["table 1: empty top-left header cell (DataFrame index)"]


def test_lint_pandas_to_html():
    page = pd.DataFrame({"a": [1.0, np.nan]}).to_html()
    assert lint.lint_text(page) == ["table 1: no <caption>", "table 1: cell 'NaN' contains 'NaN'",
                                    "table 1: index column (first column is <th> 0..1)",
                                    "table 1: empty top-left header cell (DataFrame index)"]


def test_lint_external_script():
    page = '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>'
    assert lint.lint_text(page) == [
        "external resource: <script src='https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js'>"]
    assert lint.lint_text('<script src="local.js"></script>') == ["external resource: <script src='local.js'>"]


def test_lint_external_stylesheet():
    page = '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Inter">'
    assert lint.lint_text(page) == ["external resource: <link rel=stylesheet href='https://fonts.googleapis.com/css?family=Inter'>"]
    assert lint.lint_text('<link rel="alternate" href="index.ja.html">') == []


def test_lint_css_import_and_url():
    assert lint.lint_text('<style>@import url("https://x/y.css");</style>') == [
        "external resource: @import in <style> ('https://x/y.css')",
        "external resource: url('https://x/y.css') in <style>"]
    assert lint.lint_text("<style>@font-face{src:url(https://x/f.woff2)}</style>") == [
        "external resource: url('https://x/f.woff2') in <style>"]
    assert lint.lint_text("<style>a{background:url(data:image/png;base64,AA)}</style>") == []


def test_lint_cli(tmp_path, page, capsys):
    bad = tmp_path / "bad.html"
    bad.write_text(_t("NaN"), encoding="utf-8")
    assert lint.main([str(page)]) == 0
    assert lint.main([str(page), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: table 1: cell 'NaN' contains 'NaN'" in out


# -- in the browser -------------------------------------------------------------------------

def _have_browser() -> bool:
    return CHROMIUM.exists() and importlib.util.find_spec("playwright") is not None


@pytest.mark.skipif(not _have_browser(), reason="needs /usr/bin/chromium and playwright")
def test_page_in_chromium(page, tmp_path):
    shot = tmp_path / "page.png"
    from browser import check_in_browser

    r = check_in_browser(page, screenshot=shot, full_page=True)
    assert r["images"] == 1
    assert r["broken_images"] == 0
    assert r["console_errors"] == []
    assert r["failed_requests"] == [] and r["external_requests"] == []
    assert r["errors"] == [] and not r["traceback"]
    assert r["title"] == "servelab test page"
    assert shot.stat().st_size > 0
