"""Checks of a rendered report page: what a reader would see as a notebook dump, and anything
the page would fetch from elsewhere.

    lint_html(path) -> list[str]            static checks (html.parser; no network)
    python -m servelab.report.lint reports/*/index.html   exit 1 on any problem

Problems reported by lint_html, tables and images numbered from 1 in document order:
    table N: cell 'x' contains 'NaN'         ("NaN", "None", "nan" as words; "rows ×", "...", "…")
    table N: cell 'x' uses scientific notation
    table N: no <caption>
    table N: index column (first column is <th> 0..K)
    table N: empty top-left header cell (DataFrame index)
    img N: not inside a <figure> with a <figcaption>
    img N: src is not a data: URI ('...')
    external resource: <script src='...'>
    external resource: <link rel=stylesheet href='...'>
    external resource: @import in <style> ('...')
    external resource: url('...') in <style>
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# Run as a file (python lib/servelab/report/lint.py), this folder would be sys.path[0] and its
# html.py would shadow the standard library's html package: drop it before importing html.parser.
if __name__ == "__main__" and not __package__ and sys.path and sys.path[0] \
        and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

from html.parser import HTMLParser

__all__ = ["lint_html", "lint_text", "main"]

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
_WORD_TOKENS = ("NaN", "None", "nan")
_SUB_TOKENS = ("rows ×", "...", "…")
_SCI = re.compile(r"(?<![\w.\-])[-+−]?\d+(?:\.\d*)?[eE][-+−]?\d+(?![\w.])")
_IMPORT = re.compile(r"@import\s+(?:url\()?\s*['\"]?([^'\");\s]*)", re.IGNORECASE)
_CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]+)", re.IGNORECASE)


class _Node:
    __slots__ = ("attrs", "children", "parent", "tag", "text")

    def __init__(self, tag: str, attrs: dict[str, str], parent: _Node | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[_Node | str] = []

    def iter(self, tag: str | None = None):
        for c in self.children:
            if isinstance(c, _Node):
                if tag is None or c.tag == tag:
                    yield c
                yield from c.iter(tag)

    def text_content(self) -> str:
        parts = []
        for c in self.children:
            parts.append(c if isinstance(c, str) else c.text_content())
        return "".join(parts)

    def ancestors(self):
        p = self.parent
        while p is not None:
            yield p
            p = p.parent


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = _Node("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        n = _Node(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(_Node(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:  # close it (and anything left open inside)
            self.cur = n.parent

    def handle_data(self, data: str) -> None:
        self.cur.children.append(data)


def _norm(s: str) -> str:
    return " ".join(s.split())


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _rows(table: _Node) -> list[tuple[str, _Node]]:
    """(section, tr) of this table only (not of nested tables): section is thead/tbody/tfoot/''."""
    out: list[tuple[str, _Node]] = []

    def walk(n: _Node, section: str) -> None:
        for c in n.children:
            if not isinstance(c, _Node) or c.tag == "table":
                continue
            if c.tag == "tr":
                out.append((section, c))
            elif c.tag in ("thead", "tbody", "tfoot"):
                walk(c, c.tag)
            else:
                walk(c, section)

    walk(table, "")
    return out


def _cells(tr: _Node) -> list[_Node]:
    return [c for c in tr.children if isinstance(c, _Node) and c.tag in ("td", "th")]


def _lint_table(t: int, table: _Node) -> list[str]:
    problems: list[str] = []
    rows = _rows(table)
    if not any(isinstance(c, _Node) and c.tag == "caption" for c in table.children):
        problems.append(f"table {t}: no <caption>")
    for _, tr in rows:
        for cell in _cells(tr):
            text = _norm(cell.text_content())
            if not text:
                continue
            for tok in _WORD_TOKENS:
                if re.search(rf"(?<![A-Za-z]){tok}(?![A-Za-z])", text):
                    problems.append(f"table {t}: cell {_short(text)!r} contains {tok!r}")
            for tok in _SUB_TOKENS:
                if tok in text:
                    problems.append(f"table {t}: cell {_short(text)!r} contains {tok!r}")
            if _SCI.search(text):
                problems.append(f"table {t}: cell {_short(text)!r} uses scientific notation")
    body = [tr for sec, tr in rows if sec != "thead" and not (sec == "" and all(c.tag == "th" for c in _cells(tr)))]
    firsts = [(_cells(tr) or [None])[0] for tr in body]
    if firsts and all(c is not None and c.tag == "th" for c in firsts):
        texts = [_norm(c.text_content()) for c in firsts]
        if texts == [str(i) for i in range(len(texts))]:
            problems.append(f"table {t}: index column (first column is <th> 0..{len(texts) - 1})")
    head = [tr for sec, tr in rows if sec == "thead"] or [tr for sec, tr in rows[:1]
                                                         if _cells(tr) and all(c.tag == "th" for c in _cells(tr))]
    if head:
        first = _cells(head[0])
        if first and first[0].tag == "th" and not _norm(first[0].text_content()):
            problems.append(f"table {t}: empty top-left header cell (DataFrame index)")
    return problems


def lint_text(page: str) -> list[str]:
    """lint_html on a page's text."""
    p = _Tree()
    p.feed(page)
    p.close()
    root = p.root
    problems: list[str] = []
    for t, table in enumerate(root.iter("table"), 1):
        problems += _lint_table(t, table)
    for i, img in enumerate(root.iter("img"), 1):
        fig = next((a for a in img.ancestors() if a.tag == "figure"), None)
        if fig is None or not any(True for _ in fig.iter("figcaption")):
            problems.append(f"img {i}: not inside a <figure> with a <figcaption>")
        src = img.attrs.get("src", "")
        if not src.startswith("data:"):
            problems.append(f"img {i}: src is not a data: URI ({_short(src)!r})")
    for s in root.iter("script"):
        if "src" in s.attrs:
            problems.append(f"external resource: <script src={s.attrs['src']!r}>")
    for ln in root.iter("link"):
        rels = ln.attrs.get("rel", "").lower().split()
        if "stylesheet" in rels or "preload" in rels or "modulepreload" in rels or "import" in rels:
            problems.append(f"external resource: <link rel={' '.join(rels)} href={ln.attrs.get('href', '')!r}>")
    for st in root.iter("style"):
        css = st.text_content()
        for m in _IMPORT.finditer(css):
            problems.append(f"external resource: @import in <style> ({m.group(1)!r})")
        for m in _CSS_URL.finditer(css):
            if not m.group(1).strip().startswith("data:"):
                problems.append(f"external resource: url({m.group(1).strip()!r}) in <style>")
    for m in _EMPTY_OUTPUT.finditer(page):  # a cell whose value was "" or None shown as text
        problems.append(f"an empty cell result is shown as text: {m.group(0)!r}")
    return problems


_EMPTY_OUTPUT = re.compile(r"<pre[^>]*>\s*(?:''|&#39;&#39;|\"\"|None)\s*</pre>")


def lint_html(path: str | Path) -> list[str]:
    """Problems found on the page at `path` (empty: none). Pure parsing; no network."""
    return lint_text(Path(path).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servelab.report.lint", description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="+", type=Path)
    a = ap.parse_args(argv)
    n = 0
    for page in a.pages:
        if not page.exists():
            print(f"{page}: no such file")
            n += 1
            continue
        problems = lint_html(page)
        for pr in problems:
            print(f"{page}: {pr}")
        n += len(problems)
    if n:
        print(f"{n} problem(s) in {len(a.pages)} page(s)")
        return 1
    print(f"ok: {len(a.pages)} page(s), no problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
