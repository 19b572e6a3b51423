"""Presentation primitives for the write-up notebooks: tables, figures, details, cards.

Each returns an `IPython.display.HTML`, so the last expression of a cell (or `display(...)`)
puts reading-ready HTML into the executed notebook; the servelab template renders it as is.

    table(df, "TTFT by prompt length", formats={"Δ %": "{:+.1f}"}, notes={"–": "not measured"})
    figure(fig, "Figure 1. TTFT grows linearly with prompt length.")
    details("launch command", " ".join(cmd))
    card("roomy", {"engine": "vLLM 0.32.0", "KV cache": "256 MB"})

Numbers are formatted for reading (`format_number`): thousands separators, decimals by
magnitude, never scientific notation; missing values are an en dash.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html as _html
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd

try:
    from .render import figure_png, png_size
except ImportError:  # loaded by file path, outside the servelab.report package
    import importlib.util as _ilu
    import sys as _sys
    from pathlib import Path as _Path

    _name = "servelab_report_render"
    if _name not in _sys.modules:
        _spec = _ilu.spec_from_file_location(_name, _Path(__file__).resolve().parent / "render.py")
        _mod = _ilu.module_from_spec(_spec)
        _sys.modules[_name] = _mod
        _spec.loader.exec_module(_mod)
    figure_png = _sys.modules[_name].figure_png
    png_size = _sys.modules[_name].png_size

__all__ = ["MISSING", "card", "details", "figure", "format_number", "format_value", "table"]

MISSING = "–"  # en dash, for NaN / None / NA
_MARKS = "abcdefghijklmnopqrstuvwxyz"
Format = str | Callable[[Any], str]


def _HTML(s: str) -> Any:
    from IPython.display import HTML

    return HTML(s)


def _esc(s: Any) -> str:
    """Escape text; pass through objects that are already HTML (markupsafe.Markup, IPython HTML)."""
    if hasattr(s, "__html__"):
        return s.__html__()
    if hasattr(s, "_repr_html_") and not isinstance(s, type):
        return s._repr_html_() or ""
    return _html.escape(str(s), quote=True)


class Verbatim(str):
    """Text quoted as written (an engine's error message, a source's own words), English whatever
    the page's language: a table cell shows it inside lang="en", so a reader's tools (and the
    Japanese-page check) know it is a quotation, not an untranslated phrase."""

    def __html__(self) -> str:
        return f'<span lang="en">{_esc(str(self))}</span>'


def quote_cell(text: Any, language: str) -> Any:
    """A table cell quoting English text on a page in `language` (as is on an English page)."""
    return Verbatim(text) if language != "en" and isinstance(text, str) and text else text


def quote_md(text: Any, language: str) -> Any:
    """The same for Markdown text: inline HTML that marks the quotation on a non-English page."""
    return Verbatim(text).__html__() if language != "en" and isinstance(text, str) and text else text


def is_missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        r = pd.isna(v)
        return bool(r) if isinstance(r, (bool,)) or getattr(r, "ndim", 1) == 0 else False
    except (TypeError, ValueError):
        return isinstance(v, float) and math.isnan(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, bool) and not isinstance(v, complex)


def format_number(x: Any) -> str:
    """A number for reading: integers with thousands separators; floats by magnitude
    (|x| >= 100: no decimals, >= 10: one, >= 1: two, below 1: three significant digits);
    never scientific notation. Integral floats are not given decimals only by `table` when a
    whole column is integral (token counts stored as float)."""
    if isinstance(x, numbers.Integral):
        return f"{int(x):,}"
    x = float(x)
    if math.isnan(x):
        return MISSING
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    a = abs(x)
    if a == 0:
        return "0"
    if round(a) >= 100:
        s = f"{x:,.0f}"
    elif round(a, 1) >= 10:
        s = f"{x:,.1f}"
    elif round(a, 2) >= 1:
        s = f"{x:,.2f}"
    else:
        d = min(2 - math.floor(math.log10(a)), 15)
        s = f"{x:.{d}f}"
    return "0" if s in ("-0", "-0.0", "-0.00") else s


def _apply(fmt: Format, v: Any) -> str:
    if callable(fmt):
        return str(fmt(v))
    return fmt.format(v) if "{" in fmt else format(v, fmt)


def format_value(v: Any, fmt: Format | None = None, *, integral: bool = False) -> str:
    """One value as escaped HTML text: missing -> en dash, numbers -> format_number (or fmt)."""
    if is_missing(v):
        return MISSING
    if hasattr(v, "__html__"):
        return v.__html__()
    if fmt is not None:
        return _esc(_apply(fmt, v))
    if isinstance(v, _dt.datetime):
        midnight = (v.hour, v.minute, v.second, v.microsecond) == (0, 0, 0, 0)
        return _esc(v.date().isoformat() if midnight else v.isoformat(sep=" ", timespec="seconds"))
    if _is_number(v):
        if integral and float(v).is_integer():
            return f"{int(v):,}"
        return format_number(v)
    return _esc(v)


def _col_key(col: Any) -> Any:
    return col[-1] if isinstance(col, tuple) else col


def _lookup(m: Mapping[Any, Any] | None, col: Any) -> Any:
    """Per-column option: by the column label itself, or for a MultiIndex column its last level."""
    if not m:
        return None
    if col in m:
        return m[col]
    k = _col_key(col)
    return m.get(k) if not isinstance(k, (list, dict)) else None


def _label(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _attr(cls: str) -> str:
    return f' class="{cls}"' if cls else ""


def _notes(notes: Mapping[str, str] | Iterable[str] | str | None,
           cols: list[Any]) -> tuple[list[tuple[str, str]], str, dict[int, str], list[str]]:
    """(marked notes as (marker html, text), the missing-value marker, header markers by column, plain notes)."""
    note_items: list[tuple[str, str]] = []
    missing_mark = ""
    col_marks: dict[int, str] = {}
    if isinstance(notes, str):
        return note_items, missing_mark, col_marks, [notes]
    if notes is not None and not isinstance(notes, Mapping):
        return note_items, missing_mark, col_marks, [str(n) for n in notes]
    i = 0
    for key, text in (notes or {}).items():
        if key == MISSING:
            missing_mark = _MARKS[i % 26]
            note_items.append((f"<sup class=\"fn\">{missing_mark}</sup>", f"{MISSING} {text}"))
            i += 1
        elif any(key == c or key == _col_key(c) for c in cols):
            mark = _MARKS[i % 26]
            for j, c in enumerate(cols):
                if key == c or key == _col_key(c):
                    col_marks[j] = mark
            note_items.append((f"<sup class=\"fn\">{mark}</sup>", str(text)))
            i += 1
        else:
            note_items.append((_esc(key), str(text)))
    return note_items, missing_mark, col_marks, []


def _column_info(df: Any, cols: list[Any], formats: Mapping[Any, Format] | None,
                 align: Mapping[Any, str] | None) -> list[dict[str, Any]]:
    """Per column: its format, whether it holds whole numbers, and the cell and header classes
    (numbers right, text left, long text wrapped)."""
    col_info = []
    for j, c in enumerate(cols):
        s = df.iloc[:, j]
        vals = [v for v in s.tolist() if not is_missing(v)]
        numeric = bool(vals) and all(_is_number(v) for v in vals)
        integral = numeric and all(float(v).is_integer() for v in vals) and not _lookup(formats, c)
        a = _lookup(align, c) or ("right" if numeric or (not vals and pd.api.types.is_numeric_dtype(s)) else "left")
        cls = {"right": "num", "center": "center", "left": ""}.get(a, "")
        if not numeric and any(isinstance(v, str) and len(v) > 40 for v in vals):
            cls = (cls + " text").strip()
        col_info.append({"fmt": _lookup(formats, c), "integral": integral, "cls": cls,
                         "hcls": {"right": "num", "center": "center"}.get(a, "")})
    return col_info


def _header_rows(cols: list[Any], nlev: int, colnames: list[Any], col_info: list[dict[str, Any]],
                 col_marks: dict[int, str]) -> list[str]:
    """One header row per column level; groups get colspan, columns whose lower levels are
    empty (index columns after reset_index) get rowspan."""
    head_rows = []
    labels = [tuple(_label(x) for x in (c if isinstance(c, tuple) else (c,))) for c in cols]
    covered: set[int] = set()
    for lev in range(nlev):
        cells, j = [], 0
        last = lev == nlev - 1
        while j < len(cols):
            if j in covered:
                j += 1
                continue
            lab = labels[j]
            mark = f'<sup class="fn">{col_marks[j]}</sup>' if j in col_marks else ""
            if not last and all(x == "" for x in lab[lev + 1:]):
                covered.add(j)
                text = lab[lev] or next((x for x in lab if x), "")
                cells.append(f'<th rowspan="{nlev - lev}" scope="col"{_attr(col_info[j]["hcls"])}>'
                             f"{_esc(text)}{mark}</th>")
                j += 1
                continue
            if last:
                cells.append(f'<th scope="col"{_attr(col_info[j]["hcls"])}>{_esc(lab[lev])}{mark}</th>')
                j += 1
                continue
            k = j + 1
            while k < len(cols) and k not in covered and labels[k][: lev + 1] == lab[: lev + 1] \
                    and not all(x == "" for x in labels[k][lev + 1:]):
                k += 1
            name = colnames[lev] if lev < len(colnames) else None
            text = f"{name} {lab[lev]}" if name and lab[lev] else lab[lev]
            span = f' colspan="{k - j}"' if k - j > 1 else ""
            cells.append(f'<th{span} scope="colgroup">{_esc(text)}</th>')
            j = k
        head_rows.append(("<tr>" if last else '<tr class="sl-group">') + "".join(cells) + "</tr>")
    return head_rows


def _body_rows(df: Any, col_info: list[dict[str, Any]], missing_mark: str) -> list[str]:
    body_rows = []
    for row in df.itertuples(index=False, name=None):
        tds = []
        for j, v in enumerate(row):
            info = col_info[j]
            if is_missing(v):
                mark = f'<sup class="fn">{missing_mark}</sup>' if missing_mark else ""
                tds.append(f'<td{_attr((info["cls"] + " missing").strip())}>{MISSING}{mark}</td>')
            else:
                tds.append(f'<td{_attr(info["cls"])}>{format_value(v, info["fmt"], integral=info["integral"])}</td>')
        body_rows.append("<tr>" + "".join(tds) + "</tr>")
    return body_rows


def table(df: Any, caption: str, *, formats: Mapping[Any, Format] | None = None,
          notes: Mapping[str, str] | Iterable[str] | str | None = None,
          align: Mapping[Any, str] | None = None, index: bool | str = "auto") -> Any:
    """A DataFrame as a reading table: every row and column (never truncated), caption above.

    formats: {column: "{:,.0f}" | ",.0f" | callable} overrides the default number format; a key
        matches a column label, or for MultiIndex columns the last level (e.g. "TTFT p50 (ms)").
    notes: footnotes below the table. {"–": why values are missing} puts a marker on every dash;
        {column: text} puts a marker on that column's header; any other key is written as the
        note's own marker (e.g. {"†": "..."} for a † you put in cells). A str or list: plain notes.
    align: {column: "left" | "right" | "center"}; default: numbers right, text left.
    index: "auto" (default): a named index (set_index("config"), pivot tables) becomes ordinary
        leading columns, an unnamed positional index is dropped; True: always shown; False: never.
    """
    if not isinstance(df, pd.DataFrame):
        df = pd.DataFrame(df)
    names = [n for n in df.index.names if n is not None]
    show_index = bool(names) if index == "auto" else bool(index)
    if show_index:
        if not names and df.index.nlevels == 1:
            df = df.rename_axis("#")  # an empty header cell is what lint takes for a pandas index
        df = df.reset_index()
    cols = list(df.columns)
    nlev = df.columns.nlevels
    colnames = list(df.columns.names) if nlev > 1 else [None]
    note_items, missing_mark, col_marks, plain = _notes(notes, cols)
    col_info = _column_info(df, cols, formats, align)
    out = ['<div class="sl-table"><div class="sl-table-scroll"><table>',
           f"<caption>{_esc(caption)}</caption>",
           "<thead>" + "".join(_header_rows(cols, nlev, colnames, col_info, col_marks)) + "</thead>",
           "<tbody>" + "\n".join(_body_rows(df, col_info, missing_mark)) + "</tbody>",
           "</table></div>"]
    if note_items or plain:
        lines = [f'<span class="fn-note"><span class="fn-mark">{m}</span> {_esc(t)}</span>' for m, t in note_items]
        lines += [f'<span class="fn-note">{_esc(t)}</span>' for t in plain]
        out.append('<p class="sl-table-notes">' + "".join(lines) + "</p>")
    out.append("</div>")
    return _HTML("\n".join(out))


def figure(fig: Any, caption: str, *, alt: str | None = None, dpi: int = 200, close: bool = True) -> Any:
    """A matplotlib figure as <figure><img src="data:image/png;base64,..."><figcaption>.

    Saved with `figure_png` (deterministic bytes); shown at matplotlib's nominal 100 px per inch
    (a dpi=200 PNG is drawn at half its pixel size: sharp on high-density screens and in print).
    Closes the figure (plt.close) so that the inline backend does not display it a second time.
    """
    png = figure_png(fig, dpi=dpi)
    if close:
        import matplotlib.pyplot as plt  # imported by whoever drew the figure; not at import (0.3 s for every command)

        plt.close(fig)
    w, h = png_size(png)
    scale = 100 / dpi
    b64 = base64.b64encode(png).decode("ascii")
    alt_text = alt if alt is not None else caption
    return _HTML(f'<figure class="sl-figure"><img src="data:image/png;base64,{b64}" alt="{_esc(alt_text)}" '
                 f'width="{round(w * scale)}" height="{round(h * scale)}">'
                 f"<figcaption>{_esc(caption)}</figcaption></figure>")


def details(summary: str, html_or_text: Any, *, open: bool = False) -> Any:
    """A collapsed <details> block for a long value (a launch command, a config dump).
    Text is escaped and kept as preformatted, wrapping lines; HTML objects are inserted as is."""
    if hasattr(html_or_text, "__html__") or hasattr(html_or_text, "_repr_html_"):
        inner = _esc(html_or_text)
    else:
        inner = f"<pre>{_html.escape(str(html_or_text))}</pre>"
    return _HTML(f'<details{" open" if open else ""}><summary>{_esc(summary)}</summary>{inner}</details>')


def card(title: str, rows: Mapping[str, Any], *, formats: Mapping[str, Format] | None = None) -> Any:
    """A compact key/value card (<section class="sl-card"><h4>title</h4><dl>...</dl>)."""
    items = []
    for k, v in rows.items():
        items.append(f"<dt>{_esc(k)}</dt><dd>{format_value(v, (formats or {}).get(k))}</dd>")
    return _HTML(f'<section class="sl-card"><h4>{_esc(title)}</h4><dl>{"".join(items)}</dl></section>')
