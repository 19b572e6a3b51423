"""The `capacity:` and `tune:` blocks of a study: a capacity-at-SLO search per configuration and a
one-flag-at-a-time search over engine flags. Validation only (the search runs in
`measure.capacity`, the tuning in `tune`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .common import FlagValue, Strict


class CapacityParams(Strict):
    """Search the highest sustained load whose p95 TTFT, p95 TPOT and error rate meet the study's `slo:`."""

    axis: Literal["rate", "concurrency"] = Field(
        "rate", description="rate: open-loop requests per second (the workload's arrival, constant when it is "
        "closed-loop); concurrency: closed-loop in-flight requests")
    start: float = Field(1.0, gt=0, description="first load tried (req/s or concurrent requests)")
    min_load: float = Field(0.125, gt=0, description="lowest load searched before the search gives up")
    max_load: float = Field(256.0, gt=0, description="highest load searched (capacity is at least this if it passes)")
    growth: float = Field(2.0, gt=1, description="factor between loads while bracketing")
    precision: float = Field(0.1, gt=0, le=1, description="stop when the bracket's width is this share of its low end")
    repeats: int = Field(2, ge=1, description="trials at least at each end of the bracket, the later ones after the "
                         "bisection, so that one slow minute cannot decide an end alone (their pooled requests' 95 % "
                         "interval of each p95 decides the verdict, widened where the trials differ)")
    max_repeats: int = Field(4, ge=1, description="at most this many trials pooled at one load: an end still "
                             "undecided then is reported undecided with its number of requests (passing a p95 "
                             "target needs at least 59 requests)")
    max_trials: int = Field(24, ge=1, description="trial budget of one search (two trials at each end and the loads at the target between them need more than the bracketing alone)")
    duration_s: float = Field(10.0, gt=0, description="open loop: seconds of arrivals per trial round")
    warmup_rounds: int = Field(0, ge=0, description="warmup rounds per trial (excluded)")
    rounds: int = Field(1, ge=1, description="measured rounds per trial")
    requests_per_round: int = Field(4, ge=1, description="closed loop: requests per round as a multiple of the load")
    ramp: bool = Field(True, description="closed loop: start a trial's workers evenly over one request's duration "
                       "(measured at the nearest load tried; AIPerf's concurrency ramp), so that the requests do not "
                       "run in step as one wave whose prompts are prefilled in one batch and share one TTFT; each "
                       "worker's first request is warm-up")
    bucket: str | None = Field(None, description="label of the workload bucket searched (default: the first)")
    budget_s: float | None = Field(None, gt=0, description="stop before a trial would pass this many seconds; the "
                                   "best result so far stands and --resume continues")

    @model_validator(mode="after")
    def _order(self) -> "CapacityParams":
        if not self.min_load <= self.start <= self.max_load:
            raise ValueError(f"need min_load <= start <= max_load, got {self.min_load}, {self.start}, {self.max_load}")
        if self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) is below repeats ({self.repeats})")
        return self


class TuneFlag(Strict):
    """One engine flag of a tune and the values tried for it, in order."""

    flag: str = Field(..., description="engine CLI flag without leading dashes, e.g. max-num-seqs")
    values: list[FlagValue] = Field(..., min_length=1, description="candidate values, tried one at a time against "
                                    "the incumbent")


class TuneParams(Strict):
    """`tune:` a coordinate search over engine flags: one flag at a time, one engine start per candidate,
    a change kept only when it beats the incumbent beyond noise (and its quality holds)."""

    base: str | None = Field(None, description="configuration the search starts from (default: the first)")
    flags: list[TuneFlag] = Field(..., min_length=1, description="flags searched, in order")
    objective: Literal["capacity", "goodput", "decode_c1"] = Field(
        "capacity", description="capacity at SLO (req/s, the bracket's low end; a candidate wins when its low end "
        "is above the incumbent's high end), goodput (SLO-meeting output tok/s at the capacity), or c=1 "
        "decode tok/s (bootstrap interval)")
    max_candidates: int = Field(8, ge=1, description="engine starts at most (the worst case is stated first)")

    def candidates(self) -> list[tuple[str, Any]]:
        return [(f.flag, v) for f in self.flags for v in f.values]
