"""Findings as words-to-be: an analysis says *which* sentence applies and with which numbers
(`Phrase("kv.limited", {"parts": ...})`), the report says it in the page's language
(`servelab.report.i18n.Words.say`, words in report/i18n/findings.yaml under `finding.`). Not for
wording: no prose lives here, so a Japanese page never shows an English sentence from analysis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Phrase(NamedTuple):
    """One sentence or clause: `key` names it (report/i18n/findings.yaml, `finding.<key>`), `values`
    fill its placeholders: numbers (formatted by the sentence, e.g. `{ratio:.1f}`), names, or nested
    `Phrase`/`Clauses`/`Sentences`."""

    key: str
    values: Mapping[str, Any] = {}


class Clauses(tuple):
    """Phrases said one after another as clauses of one sentence (English: joined by "; ")."""


class Sentences(tuple):
    """Phrases said as sentences one after another (English: joined by a space)."""


def clauses(*items: Any) -> Clauses:
    """`Clauses` of the items that are not None."""
    return Clauses(x for x in items if x is not None)


def sentences(*items: Any) -> Sentences:
    """`Sentences` of the items that are not None."""
    return Sentences(x for x in items if x is not None)
