"""What a study sends: request buckets (calibrated filler, a shipped prompt set, a session template,
a trace), the client's workers and the workload's levels, rounds and sampling. Strict pydantic
models: an unknown key is an error. Part of `schema.Study`."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..prompts import list_sets
from .common import Strict
from .sources import RampUp, SessionTemplate, TraceSource


class Bucket(Strict):
    trace: TraceSource | None = Field(None, description="replay a request trace: its arrivals, lengths and "
                                      "prefix blocks (measure.sources.trace)")
    prompt_set: str | None = Field(None, description="a shipped prompt set (servelab.prompts: rewrite, questions, "
                                   "lists, code, quality) sent round-robin instead of the filler; natural lengths, "
                                   "each record keeps its prompt_id and achieved prompt_tokens")
    input_tokens: int | None = Field(None, gt=0, validate_default=True, description="prompt tokens after the chat "
                                     "template (the calibrated filler; a session: each new message); leave out when "
                                     "the bucket names a prompt_set or replays a trace")
    output_tokens: int | None = Field(None, gt=0, validate_default=True, description="max_tokens: the exact output "
                                      "length with ignore_eos, the cap when the bucket stops at end-of-sequence "
                                      "(required unless the bucket replays a trace)")
    shared_prefix: bool = Field(
        False, description="one cache_salt for the whole bucket so the prefix cache is hit on purpose"
    )
    name: str | None = Field(None, description="label (default in<input>-out<output>, or <prompt_set>-out<output>)")
    same_prompts: bool = Field(False, description="prompt_set: every round sends the same prompts (request i of a "
                               "round gets the set's prompt i), as seed 001 repeats one fixed prompt; default: each "
                               "round sends the next prompts of the set")
    stop: Literal["eos", "length"] | None = Field(
        None, description="eos: stop at end-of-sequence (output lengths vary, p50/p95 reported); length: generate "
        "exactly output_tokens (ignore_eos). Default: eos for a prompt_set, the workload's ignore_eos otherwise")
    ignore_eos: bool | None = Field(None, description="shorthand for stop: true = length, false = eos")
    prefix_reuse: float | None = Field(
        None, ge=0, lt=1, description="share of each prompt's tokens that the server's prefix cache can reuse: "
        "a shared prefix of that many tokens (whole KV blocks) under one cache_salt per level, then a unique tail")
    session: SessionTemplate | None = Field(None, description="send multi-turn conversations (measure.sources.session)")

    @field_validator("input_tokens", "output_tokens")
    @classmethod
    def _needed(cls, v: int | None, info: Any) -> int | None:
        if info.field_name == "input_tokens" and info.data.get("prompt_set") is not None:
            return v
        if v is None and info.data.get("trace") is None and "trace" in info.data:
            raise PydanticCustomError("missing", "Field required")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "Bucket":
        if self.trace is not None:
            extra = [k for k in ("input_tokens", "output_tokens", "prefix_reuse", "session", "prompt_set")
                     if getattr(self, k) is not None] + (["shared_prefix"] if self.shared_prefix else [])
            if extra:
                raise ValueError(f"a trace bucket takes its lengths from the trace; remove {', '.join(extra)}")
            return self
        if self.prompt_set is not None:
            if self.input_tokens is not None or self.session is not None or self.prefix_reuse is not None:
                raise ValueError("a prompt_set bucket sends the set's own prompts; remove input_tokens, session "
                                 "and prefix_reuse")
            if self.prompt_set not in list_sets():
                close = difflib.get_close_matches(self.prompt_set, list_sets(), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(f"prompt_set: unknown set {self.prompt_set!r}{hint}; known: {', '.join(list_sets())}")
        if self.stop is not None and self.ignore_eos is not None and (self.stop == "length") != self.ignore_eos:
            raise ValueError(f"stop: {self.stop} contradicts ignore_eos: {str(self.ignore_eos).lower()}")
        if self.prefix_reuse is not None and (self.session is not None or self.shared_prefix):
            raise ValueError("prefix_reuse sets the reuse of independent requests; a session or shared_prefix "
                             "bucket sets its own")
        return self

    @property
    def source(self) -> str:
        """Which workload source builds this bucket's requests: filler, prompt_set, session or trace."""
        return ("trace" if self.trace else "session" if self.session else
                "prompt_set" if self.prompt_set else "filler")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.trace:
            return "trace-" + re.split(r"[\\/]", self.trace.path)[-1].split(".")[0]
        if self.prompt_set:
            return f"{self.prompt_set}-out{self.output_tokens}"
        base = f"in{self.input_tokens}-out{self.output_tokens}"
        if self.session:
            return f"{self.session.kind}{self.session.turns}-{base}"
        return base + (f"-reuse{round(self.prefix_reuse * 100)}" if self.prefix_reuse is not None else "")

    def ignores_eos(self, workload_default: bool) -> bool:
        """Whether requests of this bucket send ignore_eos (forced length)."""
        if self.stop is not None:
            return self.stop == "length"
        if self.ignore_eos is not None:
            return self.ignore_eos
        return False if self.prompt_set else workload_default

class WorkerBackend(Strict):
    """Where the client workers run: local processes, or Ray actors on a cluster (measure.ray_pool)."""

    backend: Literal["local", "ray"] = Field(..., description="local: processes on this machine; ray: one actor "
                                             "per worker, spread over the Ray cluster's nodes (needs the ray extra)")
    count: int = Field(1, ge=1, le=1024, description="client workers (local processes: at most 64)")
    address: str | None = Field(None, description="ray: 'auto' = the cluster this machine joined (ray start), "
                                "'ray://host:10001' = Ray Client, null = start a Ray instance on this machine")

    @model_validator(mode="after")
    def _local(self) -> "WorkerBackend":
        if self.backend == "local" and (self.count > 64 or self.address is not None):
            raise ValueError("backend local: count is at most 64 and there is no address")
        return self

class Workload(Strict):
    api: Literal["chat", "completions"] = Field("chat", description="OpenAI endpoint to call")
    buckets: list[Bucket] = Field(..., min_length=1, description="request shapes")
    concurrency: list[Annotated[int, Field(gt=0)]] = Field(..., min_length=1, description="fixed-concurrency levels")
    warmup_rounds: int = Field(2, ge=0, description="rounds per level excluded from results")
    canaries: bool = Field(False, description="the last warm-up round of every level with more than one request in "
                           "flight sends the quality set's known-answer prompts (greedy, in full) instead: their answers "
                           "under the load's batching, held against the one-at-a-time quality check")
    warmup_max_tokens: int | None = Field(None, gt=0, description="cap on a warm-up request's output tokens (a short "
                                          "warm-up still runs the level's prefill and batch shapes); default: as measured")
    rounds: int = Field(5, ge=1, description="measured rounds per level")
    requests_per_round: int = Field(
        1, ge=1, description="requests per round as a multiple of the concurrency (n = k x c)"
    )
    temperature: float = Field(0.0, ge=0, description="sampling temperature")
    seed: int | None = Field(42, description="sampling seed")
    ignore_eos: bool = Field(True, description="generate exactly max_tokens")
    timeout_s: float = Field(300.0, gt=0, description="per-request deadline")
    prompt_text: str = Field(
        "This is deterministic benchmark input text.", description="filler repeated to build prompts (seed 001)"
    )
    cache_salt: bool = Field(True, description="send a unique cache_salt per request (shared per shared_prefix bucket)")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="passed through, e.g. enable_thinking")
    continuous_usage_stats: bool = Field(False, description="ask for cumulative usage in every chunk")
    arrival: Literal["concurrency", "constant", "poisson", "gamma"] = Field(
        "concurrency", description="closed loop at fixed concurrency, or open loop at request rates "
        "(gamma: Poisson with burstiness, vLLM's definition)")
    burstiness: float = Field(1.0, gt=0, description="arrival gamma: the gamma shape of inter-arrival gaps at the "
                              "same mean rate (vLLM bench --burstiness): 1 = Poisson, < 1 burstier, > 1 more even")
    ramp_up: RampUp | None = Field(None, description="open loop: the rate moves from start_rps to end_rps over "
                                   "each round instead of staying at the level's rate")
    concurrency_ramp_s: float | None = Field(None, ge=0, description="closed loop: start the workers evenly over this "
        "many seconds, each one's first request warm-up (AIPerf's --concurrency-ramp-duration), not in one wave")
    round_duration_s: float | None = Field(
        None, gt=0, description="closed loop: each round sends for this many seconds (then lets in-flight requests "
        "end) instead of a fixed request count")
    rates_rps: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=list, description="request rates (per second) for constant/poisson arrivals")
    duration_s: float = Field(20.0, gt=0, description="length of one open-loop round (n = rate x duration)")
    max_in_flight: int = Field(1024, ge=1, description="open loop: cap on concurrent requests")
    workers: Annotated[int, Field(ge=1, le=64)] | WorkerBackend = Field(
        1, description="client workers, each with its own event loop: a number = local processes on this "
        "machine, or {backend: ray, count: N, address: ...} = Ray actors spread over a cluster")
    metrics_interval_s: float = Field(
        0.5, ge=0, description="period of the server /metrics sampling during the run (KV residency, queue, "
        "server histograms); 0 = off. Each scrape costs the server CPU (vLLM CPU build: ~8.5 ms, "
        "benchmarks/README.md), which a 2-core machine notices")
    failure_budget: float | None = Field(
        None, gt=0, le=1, description="stop a level early once this fraction of its requests failed")
    on_interrupt: Literal["cancel", "drain"] = Field(
        "cancel", description="Ctrl-C: cancel in-flight requests, or let them finish")

    @model_validator(mode="after")
    def _rates(self) -> "Workload":
        if self.arrival != "concurrency" and not self.rates_rps and not all(b.trace for b in self.buckets):
            raise ValueError(f"arrival '{self.arrival}' needs rates_rps (requests per second)")
        if self.canaries and not self.warmup_rounds and max(self.concurrency) > 1:  # at 1 in flight there are none
            raise ValueError("canaries ride in a level's warm-up round: set warmup_rounds to 1 or more")
        if self.concurrency_ramp_s and (self.arrival != "concurrency" or self.workers != 1):
            raise ValueError("concurrency_ramp_s needs a closed loop (arrival 'concurrency'); workers must be 1")
        return self
