"""Canaries: the quality set's known-answer prompts sent inside the load, in the warm-up round of a
level with more than one request in flight, so their answers are computed in the batches that load
makes (batching changes the arithmetic: on vLLM's CPU build in bf16, 7 of 16 answers changed when
the 16 were sent at once). Greedy, stopped at end-of-sequence, each with its own cache salt; their
records carry `canary` and their token ids, and are never in a throughput or latency figure (the
warm-up round is not). `analysis.quality.canaries` holds them against the configuration's
one-at-a-time answers. Not for the workload's own prompts (`prompt_set`)."""

from __future__ import annotations

from ...prompts import load_set
from ...schema import Bucket, Workload
from .base import Draft, RoundCtx

CANARY_SET = "quality"


def canary_drafts(bucket: Bucket, wl: Workload, ctx: RoundCtx) -> list[Draft]:
    """The round's `ctx.n` requests as canaries: the known-answer prompts in order (again from the
    first when the round is larger than the set), each as long as the bucket's output cap allows."""
    ps = load_set(CANARY_SET)
    out = []
    for i in range(ctx.n):
        p = ps.prompts[i % len(ps.prompts)]
        salt = f"{ctx.run_token}-canary-{ctx.first_seq + i}" if wl.cache_salt else None
        out.append(Draft(max_tokens=bucket.output_tokens or 64, prompt=p.raw(),
                         messages=p.chat() if wl.api == "chat" else None, cache_salt=salt,
                         meta={"source": "canary", "canary": True, "prompt_set": ps.name, "prompt_id": p.id},
                         keep_text=True, ignore_eos=False, extra_body={"return_token_ids": True}))
    return out


__all__ = ["CANARY_SET", "canary_drafts"]
