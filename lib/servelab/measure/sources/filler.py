"""The calibrated filler source (servelab's original workload): every request of a bucket has
the same exact-length prompt. Its cache knobs: a unique cache_salt per request (cold misses by
construction), one salt per bucket (`shared_prefix`: the whole prompt reusable), or
`prefix_reuse: r`: a shared prefix of r x input_tokens (rounded to whole KV blocks of the
server) under one salt per level, followed by a unique marker and filler up to the exact
length, so the prefix cache can serve that share of every prompt and no more."""

from __future__ import annotations

from typing import Any

from ...schema import Bucket, Workload
from ..workload import Calibrated, TokenCounter, calibrate
from .base import Draft, RoundCtx, marker


class FillerSource:
    kind = "filler"
    independent = True

    def __init__(self, bucket: Bucket, wl: Workload, counter: TokenCounter, block_tokens: int | None) -> None:
        self.bucket, self.wl = bucket, wl
        self.block_tokens = block_tokens or 1
        assert bucket.input_tokens and bucket.output_tokens
        self.reuse_tokens: int | None = None
        self.prefix: Calibrated | None = None
        if bucket.prefix_reuse is None:
            self.cal = calibrate(counter, bucket.input_tokens, wl.prompt_text)
            return
        n, b = bucket.input_tokens, self.block_tokens
        self.reuse_tokens = int(round(bucket.prefix_reuse * n / b)) * b
        overhead = counter.count("a") - 1  # chat template tokens around the message
        # the shared prefix ends mid-block, so whole blocks of reuse_tokens hit and the next one cannot
        common = self.reuse_tokens + b // 2
        if self.reuse_tokens:
            self.prefix = calibrate(counter, common + overhead - overhead // 2, wl.prompt_text)
            head = self.prefix.prompt + " " + marker(0) + " "
        else:
            head = marker(0) + " "
        self.cal = calibrate(counter, n, wl.prompt_text, head=head)
        self.tail = self.cal.prompt[len(head):]

    def calibration(self) -> dict[str, Any]:
        c = self.cal
        d = {"target_tokens": c.target_tokens, "tokens": c.tokens, "counter": c.counter, "probes": c.probes,
             "prompt_chars": len(c.prompt)}
        if self.reuse_tokens is not None:
            d.update(source="filler", prefix_reuse=self.bucket.prefix_reuse, reuse_tokens=self.reuse_tokens,
                     block_tokens=self.block_tokens)
        return d

    def prompt_for(self, seq: int) -> str:
        if self.reuse_tokens is None:
            return self.cal.prompt
        head = (self.prefix.prompt + " ") if self.prefix else ""
        return head + marker(seq + 1) + " " + self.tail

    def drafts(self, ctx: RoundCtx) -> list[Draft]:
        b, wl = self.bucket, self.wl
        out = []
        for i in range(ctx.n):
            seq = ctx.first_seq + i
            salt = None
            if wl.cache_salt:
                if b.prefix_reuse is not None:
                    salt = f"{ctx.run_token}-{b.label}-L{ctx.level}"
                else:
                    salt = f"{ctx.run_token}-{b.label}" if b.shared_prefix else f"{ctx.run_token}-{seq}"
            meta: dict[str, Any] = {"source": "filler"}
            if self.reuse_tokens is not None:
                meta.update(prefix_reuse=b.prefix_reuse, reuse_tokens=self.reuse_tokens)
            out.append(Draft(max_tokens=b.output_tokens, prompt=self.prompt_for(seq), cache_salt=salt,
                             at_s=ctx.offsets[i] if ctx.offsets else None, meta=meta,
                             ignore_eos=b.ignores_eos(wl.ignore_eos)))
        return out
