"""What every workload source hands the runner: drafts of requests (`Draft`) with the record
fields that say where each came from, and the round it belongs to (`RoundCtx`). Also the
deterministic text pieces sources build prompts from: single-letter words (one token each
in the tokenizers servelab meets, so a block of n words is about n tokens) seeded by an id,
so equal ids give equal text. Not for sending or records (`runner`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

# consonants: each " x" is one token in Llama/Qwen/SmolLM vocabularies (vowels can merge, " u" splits)
LETTERS = "bcdfghjklmnpqrstvwxyz"


@dataclass
class Draft:
    """One request as a source plans it; the runner adds the workload's sampling settings."""

    max_tokens: int
    prompt: str = ""
    messages: list[dict[str, Any]] | None = None
    cache_salt: str | None = None
    at_s: float | None = None  # open loop: scheduled offset from the round start
    meta: dict[str, Any] = field(default_factory=dict)  # record fields of this source
    keep_text: bool = False  # the source needs the answer's text back (a session's real history)
    ignore_eos: bool | None = None  # the bucket's own choice (`Bucket.ignores_eos`); None: the workload's
    extra_body: dict[str, Any] = field(default_factory=dict)  # further request fields (a canary's return_token_ids)


@dataclass
class RoundCtx:
    """The round a source plans for."""

    run_token: str  # unique per run: salts never collide with another run's cache
    level: int
    round: int
    concurrency: int
    rate_rps: float
    n: int  # requests (independent sources) or sessions (session source) in this round
    offsets: list[float] | None  # open-loop send times for the n items, None = closed loop
    first_seq: int  # the seq the round's first request gets (unique per run)


def letter_words(n: int, seed: int | str) -> str:
    """n single-letter words drawn by a RNG seeded with `seed`: equal seeds, equal text."""
    rng = random.Random(str(seed))
    return " ".join(rng.choice(LETTERS) for _ in range(max(0, n)))


def marker(i: int, width: int = 5) -> str:
    """A fixed-width word sequence unique to i (base-21 digits as letters): breaks a shared
    prefix at a known point without changing the prompt's length."""
    out = []
    for _ in range(width):
        i, d = divmod(i, len(LETTERS))
        out.append(LETTERS[d])
    return " ".join(out)
