"""Every heading and sentence of the write-up in English and Japanese, from one table kept as
one file per report area (`i18n/<area>.yaml`, semantic dotted keys such as `headline.fastest`);
`words(lang)` returns a lookup that fills `{placeholders}` (format specs such as `{ratio:.1f}`
work, so code hands over numbers, not phrases). A key missing in one language, or defined in
two files, is an error, so a Japanese report never falls back to English mid-page."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from .. import yamlio

from ..analysis.phrase import Clauses, Phrase, Sentences

LANGUAGES = ("en", "ja")


@cache
def table() -> dict[str, dict[str, str]]:
    here = Path(__file__).parent
    data: dict[str, dict[str, str]] = {}
    for path in sorted((here / "i18n").glob("*.yaml")):
        part = yamlio.safe_load(path.read_text(encoding="utf-8")) or {}
        twice = sorted(set(part) & set(data))
        if twice:
            raise KeyError(f"{path.name}: keys already defined in another i18n file: {twice}")
        data.update(part)
    for key, v in data.items():
        missing = [lang for lang in LANGUAGES if lang not in v]
        if missing:
            raise KeyError(f"i18n: {key} has no {missing}")
    return data


class Words:
    """`w("key", n=3)`: the sentence `key` in this language with its placeholders filled."""

    def __init__(self, lang: str) -> None:
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; expected one of {LANGUAGES}")
        self.lang = lang

    def __call__(self, key: str, **values: Any) -> str:
        text = table()[key][self.lang]
        return text.format(**values) if values else text

    def say(self, finding: Any) -> Any:
        """An analysis finding in words: a `Phrase` is the sentence `finding.<key>` with its nested
        phrases said first; `Clauses`/`Sentences` are joined the way this language joins them
        (`finding.clause_sep`, `finding.sentence_sep`); anything else (numbers, names) is itself."""
        if isinstance(finding, Phrase):
            return self(f"finding.{finding.key}", **{k: self.say(v) for k, v in finding.values.items()})
        if isinstance(finding, Clauses):
            return self("finding.clause_sep").join(self.say(x) for x in finding)
        if isinstance(finding, Sentences):
            return self("finding.sentence_sep").join(self.say(x) for x in finding)
        return finding


def words(lang: str) -> Words:
    return Words(lang)
