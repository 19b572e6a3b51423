"""Workload sources: where a bucket's requests come from. Each source
turns a bucket into drafts of requests (`base.Draft`) that carry their own record fields
(`source`, and e.g. `session_id`/`turn` or `trace_index`), so the runner, the summary and the
report need not know which one produced a request. Independent sources (`filler`, `trace`)
plan a round as a list of drafts; the session source runs its round itself, because each turn
waits for the answer before it. `make_source` is the one place that picks a source by bucket.
Not for sending (`workers`, `client`) or writing records (`runner`)."""

from __future__ import annotations

from typing import Any

from ...schema import Bucket, Workload
from ..workload import TokenCounter
from .base import Draft, RoundCtx
from .filler import FillerSource
from .prompt_set import PromptSetSource
from .session import SessionSource
from .trace import TraceReplay

__all__ = ["Draft", "RoundCtx", "FillerSource", "PromptSetSource", "SessionSource", "TraceReplay", "make_source"]


def make_source(bucket: Bucket, wl: Workload, counter: TokenCounter, block_tokens: int | None = None) -> Any:
    """The source for this bucket, calibrated against `counter` (the server's token counts);
    `block_tokens` is the server's KV block size (prefix reuse is counted in whole blocks)."""
    if bucket.trace is not None:
        return TraceReplay(bucket, wl, counter)
    if bucket.session is not None:
        return SessionSource(bucket, wl, counter)
    if bucket.prompt_set is not None:
        return PromptSetSource(bucket, wl)
    return FillerSource(bucket, wl, counter, block_tokens)
