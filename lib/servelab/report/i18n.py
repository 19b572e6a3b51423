"""Every heading and sentence of the write-up in English and Japanese, from one table
(`i18n.yaml`); `words(lang)` returns a lookup that fills `{placeholders}`. A key missing in
one language is an error, so a Japanese report never falls back to English mid-page."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

LANGUAGES = ("en", "ja")


@cache
def table() -> dict[str, dict[str, str]]:
    data = yaml.safe_load((Path(__file__).with_name("i18n.yaml")).read_text(encoding="utf-8"))
    for key, v in data.items():
        missing = [lang for lang in LANGUAGES if lang not in v]
        if missing:
            raise KeyError(f"i18n.yaml: {key} has no {missing}")
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


def words(lang: str) -> Words:
    return Words(lang)
