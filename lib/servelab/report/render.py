"""Executed notebook -> one standalone, deterministic HTML page for reading.

`notebook_to_html` renders with the `servelab` nbconvert template (templates/servelab/: inputs,
prompts and code hidden, style.css inlined, no script or stylesheet from anywhere) after
normalising the notebook so that the same executed content always gives the same bytes:
cell ids are set from the cell index, papermill/execution timing metadata is dropped, pandas
Styler's random table ids are renumbered. Images stay embedded as data URIs.

`figure_png` saves a matplotlib figure to PNG bytes without the version-stamped `Software`
chunk, so that two saves of the same figure (and two runs with the same matplotlib, FreeType
and fonts) give identical bytes.

Imports only the standard library, nbformat, nbconvert (and matplotlib inside figure_png).
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "servelab"

# Cell metadata written by tools at execution time; none of it is content.
_VOLATILE_CELL_META = ("papermill", "execution", "ExecuteTime", "collapsed", "scrolled", "jupyter", "trusted")
# Notebook metadata that is timing/environment, not content (kept: kernelspec, language_info, servelab, ...).
_VOLATILE_NB_META = ("papermill", "widgets", "toc", "varInspector")
_STYLER_ID = re.compile(r"\bT_([0-9a-f]{5})(?=[_\"'\s{.#,>])")


def normalise_notebook(nb: Any) -> Any:
    """A deep copy of `nb` with every non-content, run-dependent field made stable.

    - cell ids: "cell-<index>" (nbformat >= 4.5 requires ids; random ones change every run);
    - cell metadata: papermill's start_time/end_time/duration/status/exception, `execution`
      (iopub timestamps), ExecuteTime, collapsed/scrolled/jupyter UI state dropped;
    - execution_count: None (prompts are not shown, but the count is run-dependent);
    - execute_results that are only an object repr with a memory address ("<... at 0x7f...>")
      dropped (the value of a cell ending in `ax.plot(...)`);
    - notebook metadata: papermill block (start/end time, duration, input/output paths,
      environment) and widget state dropped;
    - pandas Styler ids (T_<5 hex>) renumbered in order of appearance (T_s0, T_s1, ...);
    - output metadata of display outputs: keys sorted (nbformat writes sorted anyway).
    """
    nb = copy.deepcopy(nb)
    for key in _VOLATILE_NB_META:
        nb.metadata.pop(key, None)
    styler_ids: dict[str, str] = {}

    def restyle(html: str) -> str:
        def sub(m: re.Match[str]) -> str:
            return "T_" + styler_ids.setdefault(m.group(1), f"s{len(styler_ids)}")

        return _STYLER_ID.sub(sub, html)

    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
        md = cell.get("metadata", {})
        for key in _VOLATILE_CELL_META:
            md.pop(key, None)
        if cell.get("cell_type") == "code":
            cell["execution_count"] = None
            cell["outputs"] = [o for o in cell.get("outputs", []) if not _is_object_repr(o)]
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = None
                data = out.get("data") or {}
                html = data.get("text/html")
                if html is not None:
                    html = "".join(html) if isinstance(html, list) else html
                    data["text/html"] = restyle(html)
                if "transient" in out:  # display ids: random per run
                    out.pop("transient", None)
    return nb


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def _is_object_repr(out: Any) -> bool:
    """An execute_result that is only the plain-text repr of an object with its memory address
    (`[<matplotlib.lines.Line2D at 0x7f...>]`, left by a cell ending in `ax.plot(...)`): noise to
    a reader, and different on every run."""
    if out.get("output_type") != "execute_result":
        return False
    data = out.get("data") or {}
    text = data.get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else text
    return set(data) == {"text/plain"} and bool(_ADDRESS.search(text))


def _read(nb_path_or_node: Any) -> tuple[Any, Path | None]:
    import nbformat

    if isinstance(nb_path_or_node, (str, Path)):
        path = Path(nb_path_or_node)
        return nbformat.read(str(path), as_version=4), path
    nb = nb_path_or_node
    if getattr(nb, "nbformat", 4) != 4:
        nb = nbformat.convert(nb, 4)
    return nb, None


def notebook_to_html(nb_path_or_node: Any, out_path: str | Path, *, title: str, language: str | None = None,
                     alternate: Mapping[str, str] | None = None, scrub: Callable[[str], str] | None = None) -> Path:
    """Render an executed notebook (path or nbformat node) to `out_path`; returns `out_path`.

    language: the page's `<html lang>`; None: the notebook's metadata `["servelab"]["language"]`, else "en".
    alternate: {"href": "index.ja.html", "label": (i18n page.other_language), "lang": "ja" (optional)}: a link to the
        other-language version at the top of the page; None: metadata `["servelab"]["alternate"]`, if any.
    scrub: applied to the page text before it is written (servelab's secret scrubber), except
        inside base64 image payloads (see `scrub_text`).
    The same notebook content always gives byte-identical output (see `normalise_notebook`).
    """
    from nbconvert import HTMLExporter

    nb, path = _read(nb_path_or_node)
    nb = normalise_notebook(nb)
    sl = dict(nb.metadata.get("servelab") or {})
    sl["language"] = language or sl.get("language") or "en"
    if alternate is not None:
        sl["alternate"] = dict(alternate)
    sl["title"] = title
    nb.metadata["servelab"] = sl

    exp = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATE_DIR)],
                       exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
                       embed_images=False, sanitize_html=False)
    resources = {"metadata": {"name": title, "path": str(path.parent) if path else ""}}
    body, _ = exp.from_notebook_node(nb, resources=resources)
    body = _tidy(body)
    if scrub is not None:
        body = scrub_text(body, scrub)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(body.encode("utf-8"))
    return out


_DATA_URI = re.compile(r"(data:[\w.+-]+/[\w.+-]+;base64,)([A-Za-z0-9+/=]+)")


def scrub_text(page: str, scrub: Callable[[str], str]) -> str:
    """`scrub` applied to the page except inside base64 data-URI payloads: a string scrubber
    cannot find a secret there (it is encoded) but could corrupt an image whose base64 happens
    to contain a short secret value."""
    parts = _DATA_URI.split(page)  # [text, prefix, payload, text, prefix, payload, ..., text]
    out = []
    for i, part in enumerate(parts):
        out.append(scrub(part) if i % 3 == 0 else part)
    return "".join(out)


def _tidy(page: str) -> str:
    """Trailing spaces and runs of blank lines left by the template: stable, smaller output."""
    lines = [ln.rstrip() for ln in page.replace("\r\n", "\n").split("\n")]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):
            out.append(ln)
    return "\n".join(out).strip("\n") + "\n"


def figure_png(fig: Any, *, dpi: int = 200) -> bytes:
    """The figure as PNG bytes, deterministically.

    metadata={"Software": None} drops the only variable chunk matplotlib writes into a PNG
    ("Matplotlib version3.x.y, https://matplotlib.org/"; PNGs carry no date), so two saves of one
    figure are byte-identical, and so are two runs on one machine. Across machines or versions
    the pixels may still differ: Agg text rendering depends on the matplotlib and FreeType
    versions and on which fonts are installed (font fallback), and libpng/zlib versions can
    change the compression. Pin those (one venv, one container) for byte-stable figures.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None}, facecolor="white",
                bbox_inches="tight", pad_inches=0.1)
    return buf.getvalue()


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from the PNG header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
