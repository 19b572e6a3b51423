"""The report's words live in report/i18n/*.yaml and nowhere else: no Japanese text in
lib/**/*.py, no prose chosen by branching on the language, every key the code asks for exists
in both languages, and what the analyses find reaches the Japanese page in Japanese."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from servelab.analysis.phrase import Clauses, Phrase, Sentences
from servelab.report.i18n import table, words
from paths import ROOT

LIB = ROOT / "lib" / "servelab"
# hiragana, katakana, CJK ideographs and punctuation, full-width forms
JAPANESE = re.compile(r"[\u3000-\u303f\u3040-\u309f\u30a0-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
LANG_NAMES = {"en", "lang", "language", "ja"}


def _modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_japanese_text_in_the_library_code():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:60]}" for p in _modules()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if JAPANESE.search(line)]
    assert found == []


def _mentions_language(node: ast.AST) -> bool:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    consts = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
    return bool(names & LANG_NAMES) or bool(consts & {"en", "ja"}) and bool(names & {"language", "lang"})


def _is_text(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"[A-Za-z]{2,}", node.value):
        return True
    return isinstance(node, (ast.JoinedStr, ast.List, ast.BinOp)) and any(
        isinstance(n, (ast.Constant, ast.JoinedStr)) for n in ast.walk(node))


def language_branches(source: str) -> list[int]:
    """Lines where text is chosen by the language: `"..." if en else "..."`, `{"en": "...", "ja": ...}[lang]`."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.IfExp) and _mentions_language(n.test) and (_is_text(n.body) or _is_text(n.orelse)):
            out.append(n.lineno)
        if isinstance(n, ast.Dict) and {getattr(k, "value", None) for k in n.keys} >= {"en", "ja"}:
            out.append(n.lineno)
    return out


def test_the_branch_finder_finds_what_it_should():
    assert language_branches('x = "yes" if en else "はい"') == [1]
    assert language_branches('x = ("yes" if sd.language == "en" else "no")') == [1]
    assert language_branches('x = {"en": "word", "ja": "言葉"}[lang]') == [1]
    assert language_branches('x = 1 if en else 2') == []
    assert language_branches('font = "DejaVu" if cjk else "Noto"') == []


def test_no_prose_branches_on_the_language():
    found = [f"{p.relative_to(ROOT)}:{i}" for p in _modules() for i in language_branches(p.read_text(encoding="utf-8"))]
    assert found == []


def _asked_keys() -> dict[str, str]:
    """Every literal key the code and the write-up notebook ask `w(...)` for."""
    out = {}
    for p in [*_modules(), *sorted((ROOT / "notebooks").glob("*.py"))]:
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
                    and isinstance(n.args[0].value, str)
                    and (getattr(n.func, "id", None) == "w" or getattr(n.func, "attr", None) == "w")):
                out[n.args[0].value] = f"{p.relative_to(ROOT)}:{n.lineno}"
    return out


def test_every_key_asked_for_exists_and_is_semantic():
    keys = table()
    asked = _asked_keys()
    assert len(asked) > 80
    assert {k: where for k, where in asked.items() if k not in keys} == {}
    # semantic dotted keys (area.what), never named after a source line
    assert [k for k in keys if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", k) or re.search(r"_\d+$", k)] == []


def test_every_sentence_has_the_same_placeholders_in_both_languages():
    def fields(text):
        return sorted({m.split(":")[0].split("!")[0] for m in re.findall(r"{([^{}]*)}", str(text))})
    assert {k: v for k, v in table().items() if fields(v["en"]) != fields(v["ja"])} == {}


def test_japanese_words_are_japanese():
    # every sentence of the Japanese table that has letters has Japanese in it, unless it is the
    # same technical term in both languages (a metric name, a formula, "SLO")
    plain = {k for k, v in table().items()
             if isinstance(v["ja"], str) and re.search(r"[A-Za-z]{4,} [A-Za-z]{4,} [A-Za-z]{4,}", v["ja"])
             and not JAPANESE.search(v["ja"]) and v["ja"] != v["en"]}
    assert plain == set()


@pytest.mark.parametrize("lang,expect", [("en", "up to 3 request(s) waited while KV usage was >= 90% (peak 97.0%); the server preempted 2 time(s)."),
                                         ("ja", "最大 3 件のリクエストが待機しました")])
def test_findings_are_said_in_the_page_language(lang, expect):
    said = words(lang).say(Sentences([Phrase("kv.limited", {"parts": Clauses([
        Phrase("kv.crowded", {"waiting": 3, "threshold": 0.9, "peak": 0.97}), Phrase("kv.preempted", {"n": 2.0})])})]))
    assert expect in said
    assert "KV" in said and ("；" in said) == (lang == "ja")


# The pages whose every sentence is translated. h200-moe, local-cpu and local-cpu-tune still carry English
# phrases on their Japanese page (price sources, engine error lines, a few new section sentences): to do.
WHOLLY_JAPANESE = sorted(p.parent.name for p in (ROOT / "reports").glob("*/index.ja.html"))


@pytest.mark.parametrize("page_path", [ROOT / "reports" / s / "index.ja.html" for s in WHOLLY_JAPANESE],
                         ids=lambda p: p.parent.name)
def test_the_published_japanese_page_is_japanese(page_path):
    # visible text only: no scripts, styles, figures, launch commands (<pre>), code or the
    # study's own prompt text (<em>), nor quotations marked lang="en" (an engine's error message,
    # a datasheet's or a price source's own words); what is left must not hold an English phrase of 4+ words
    page = page_path.read_text(encoding="utf-8")
    page = re.sub(r'<span lang="en">.*?</span>', " ", page, flags=re.S)
    page = re.sub(r"<(script|style|pre|code|em)\b[^>]*>.*?</\1>", " ", page, flags=re.S)
    text = re.sub(r"<[^>]+>", "\n", re.sub(r"<img[^>]*>", "", page))
    english = [line.strip() for line in text.splitlines()
               if re.search(r"([A-Za-z]{3,}[ ,;:()]+){3}[A-Za-z]{3,}", line)]  # the page before this change: 16
    assert english == []


def test_every_bold_phrase_renders_as_bold():
    """Markdown's `**` closes only where CommonMark lets it: after a full-width colon and before a digit
    it stays two literal asterisks on the page (the Japanese launch-disturbance sentence, 2026-12-05)."""
    import re
    import string

    from nbconvert.filters.markdown import markdown2html

    from servelab.report.i18n import table

    class Filler(dict):
        def __missing__(self, key):
            return "X1"

    left = []
    for key, v in table().items():
        for lang, text in v.items():
            if "**" not in text:
                continue
            try:
                filled = string.Formatter().vformat(text, (), Filler())
            except (ValueError, TypeError):  # a format spec for numbers
                filled = re.sub(r"\{[^{}]*\}", "X1", text)
            if "**" in markdown2html(filled):
                left.append(f"{key} [{lang}]")
    assert not left, left
