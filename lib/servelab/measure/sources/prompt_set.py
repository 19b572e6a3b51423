"""The prompt-set source: a shipped prompt set (`servelab.prompts`: real text of natural length)
sent round-robin, deterministically (the i-th request of a level always gets the same prompt), or
with `same_prompts` the same ones every round (request i of any round gets prompt i).
Each record keeps `prompt_set` and `prompt_id`; its achieved length is the server's
`prompt_tokens`. A bucket of this source stops at end-of-sequence unless it forces its length
(`Bucket.ignores_eos`)."""

from __future__ import annotations

from typing import Any

from ...prompts import load_set
from ...schema import Bucket, Workload
from .base import Draft, RoundCtx


class PromptSetSource:
    kind = "prompt_set"
    independent = True

    def __init__(self, bucket: Bucket, wl: Workload) -> None:
        assert bucket.prompt_set and bucket.output_tokens
        self.bucket, self.wl = bucket, wl
        self.set = load_set(bucket.prompt_set)

    def calibration(self) -> dict[str, Any]:
        return {"source": "prompt_set", "prompt_set": self.set.name, "prompts": len(self.set.prompts)}

    def drafts(self, ctx: RoundCtx) -> list[Draft]:
        b, wl, ps = self.bucket, self.wl, self.set
        out = []
        for i in range(ctx.n):
            seq = ctx.first_seq + i
            salt = None
            if wl.cache_salt:
                salt = f"{ctx.run_token}-{b.label}" if b.shared_prefix else f"{ctx.run_token}-{seq}"
            p = ps.prompts[(i if b.same_prompts else ctx.round * ctx.n + i) % len(ps.prompts)]
            out.append(Draft(max_tokens=b.output_tokens, prompt=p.raw(),
                             messages=p.chat() if wl.api == "chat" else None, cache_salt=salt,
                             at_s=ctx.offsets[i] if ctx.offsets else None,
                             meta={"source": "prompt_set", "prompt_set": ps.name, "prompt_id": p.id},
                             ignore_eos=b.ignores_eos(wl.ignore_eos)))
        return out
