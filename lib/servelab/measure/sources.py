"""Where a bucket's prompts come from: the calibrated filler (`workload.calibrate`, one prompt of
an exact length) or a shipped prompt set (`servelab.prompts`, real text of natural length sent
round-robin). Both give the runner the same thing per request: the text or chat messages to
send and the ids a record keeps (`prompt_set`, `prompt_id`). Deterministic: the i-th request of
a level always gets the same prompt. Not for sending (`runner`) or counting tokens (`workload`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..prompts import PromptSet, load_set
from ..schema import Bucket, Workload
from .workload import Calibrated


@dataclass(frozen=True)
class PromptChoice:
    """What one request sends: `prompt` (filler or the raw text) and, for chat, `messages`."""

    prompt: str
    messages: list[dict[str, Any]] | None = None
    prompt_set: str | None = None
    prompt_id: str | None = None


def prompt_sets(wl: Workload) -> dict[str, PromptSet]:
    """The prompt sets the workload's buckets name, loaded once (bucket label -> set)."""
    return {b.label: load_set(b.prompt_set) for b in wl.buckets if b.prompt_set}


def choose(bucket: Bucket, api: str, index: int, filler: Calibrated | None,
           sets: dict[str, PromptSet]) -> PromptChoice:
    """The prompt of the `index`-th request of a level of `bucket` (round-robin over a set)."""
    if bucket.prompt_set is None:
        assert filler is not None, f"bucket {bucket.label} was not calibrated"
        return PromptChoice(filler.prompt)
    ps = sets[bucket.label]
    p = ps.prompts[index % len(ps.prompts)]
    return PromptChoice(p.raw(), p.chat() if api == "chat" else None, ps.name, p.id)


def target_input_tokens(bucket: Bucket) -> int:
    """The record's target_input_tokens: the filler's exact length, 0 for a prompt set (natural
    lengths; the achieved ones are in prompt_tokens)."""
    return int(bucket.input_tokens or 0)
