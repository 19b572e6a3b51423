"""Every dotted `servelab.*` name a docstring, a comment or a report sentence mentions exists: a
module that imports, or an attribute of one. A renamed or removed module shows up here instead
of in a newcomer's search (or, printed in a report, in a reader's)."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path
from paths import ROOT

LIB = ROOT / "lib" / "servelab"
NAME = re.compile(r"\bservelab(?:\.[A-Za-z_]\w*)+")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    src = path.read_text(encoding="utf-8")
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(n, clean=False)
            if doc:
                out.append((n.body[0].lineno, doc))
    return out


def resolves(name: str) -> bool:
    """`servelab.a.b.c`: the longest importable prefix, then attributes for the rest."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_the_resolver_tells_real_names_from_stale_ones():
    assert resolves("servelab.analysis.kv.kv_verdict") and resolves("servelab.report.i18n.Words.say")
    assert not resolves("servelab.hardware.decode_bound_s_per_token")  # a module that no longer exists
    assert not resolves("servelab.analysis.kv.no_such_function")


def test_every_servelab_name_in_docstrings_and_comments_resolves():
    stale = [f"{p.relative_to(ROOT)}:{line}: {m}" for p in sorted(LIB.rglob("*.py")) if "__pycache__" not in p.parts
             for line, text in _prose(p) for m in NAME.findall(text) if not resolves(m.rstrip("."))]
    assert stale == []


def test_every_servelab_name_in_the_report_words_resolves():
    stale = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((LIB / "report" / "i18n").glob("*.yaml"))
             for m in NAME.findall(p.read_text(encoding="utf-8")) if not resolves(m.rstrip("."))]
    assert stale == []
