"""Typed, strict study parameters: the schema of `params/<study>.yaml` (every params model).

A study is an ordered list of configurations measured with one workload. Every model
forbids unknown keys; `load_study` turns any validation problem into a `ParamsError`
whose message names the file, the key path and what was expected (with a suggestion for
a misspelled key). This module only validates and merges; it starts nothing. It imports pydantic, yaml and the
engine flag tables (`servelab.engines`, which knows no schema) only.
"""

from __future__ import annotations

import difflib
import json

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from .. import yamlio
from pydantic import BaseModel, Field, ValidationError, model_validator

from ..errors import UserError




from .parts import (GPU_AMI_PARAMETER, HOST_KINDS, HOURS_PER_MONTH, AttachHostParams, AttachParams, AwsEcsHostParams,
                    AwsInstanceHostParams, AwsParams, Bucket, Configuration, CostParams, EngineParams, HostParams,
                    LocalHostParams, ModelRef, Slo, Strict, Workload, Placement, PeerRun, StudyTexts,
                    QualityParams, CHECKS)
from .sources import RampUp, SessionTemplate, TraceSource
from .capacity import CapacityParams, TuneFlag, TuneParams

class Design(Strict):
    """How a study's configurations are measured and compared (analysis.verdicts, measure.interleave)."""

    interleave: Literal["auto", "off"] = Field(
        "auto", description="auto: start the engines side by side when they fit in memory (local host, one shared "
        "workload) and measure them in alternating order, one round at a time; off: one configuration after another")
    budget_s: float | None = Field(
        None, gt=0, description="wall time of the measurement (engine starts, quality checks, rounds) in seconds: "
        "rounds beyond the workload's go where a verdict is still open until it is spent (None: no extra rounds)")
    mde_target_pct: float = Field(
        10.0, gt=0, le=100, description="the minimum detectable effect (percent of aggregate tok/s) at which a "
        "comparison needs no more rounds")
    max_rounds: int = Field(30, ge=1, description="measured rounds per level and start at most")
    between_starts_sd_pct: float | None = Field(
        None, ge=0, description="between-start standard deviation of aggregate tok/s on this host (percent), measured "
        "by a separate A/A experiment; used only when the study repeats no start itself")


class Explains(Strict):
    """What a follow-up study explains (`servelab explain`): a published study and its configuration."""

    study: str = Field(..., description="the published study (reports/<study>)")
    config: str = Field(..., description="its configuration whose change surprised")


class Followups(Strict):
    """Follow-up experiments run automatically after the study (`servelab explain` per surprise)."""

    enabled: bool = Field(False, description="after the report, run the follow-up sweeps of every surprise")
    budget_s: float = Field(900.0, gt=0, description="time budget of each follow-up study (design.budget_s)")
    max_studies: int = Field(2, ge=1, description="follow-up studies at most (one per surprising configuration)")


def upgrade_device_block(data: dict[str, Any]) -> dict[str, Any]:
    """A study written with the old `device:` block (before 2026-12-06) in today's shape: where its engines ran
    (gpus, lanes, all_gpus, groups, stagger_s) becomes `placement:`, what ran beside the workloads becomes
    `peers:`, `checks:` and `capacity_runs:`; `site` (a PYTHONPATH per engine kind on one machine) is dropped:
    an engine's own environment is `engine.python`."""
    dev = data.get("device")
    out = {k: v for k, v in data.items() if k != "device"}
    if not isinstance(dev, dict):  # `device: null`: written by a study.json of a CPU study
        return out
    out["placement"] = {"gpus": dev.get("gpus", 1),  # the old block's default: one GPU
                        **{k: dev[k] for k in ("lanes", "all_gpus", "groups", "stagger_s") if k in dev},
                        **(data.get("placement") or {})}
    for old, new in (("peers", "peers"), ("checks", "checks"), ("capacity", "capacity_runs")):
        if dev.get(old):
            out[new] = {**dev[old], **(data.get(new) or {})}
    return out


class Study(Strict):
    @model_validator(mode="before")
    @classmethod
    def _host_kind_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("host"), dict) and "kind" not in data["host"]:
            data = {**data, "host": {"kind": "local", **data["host"]}}
        if isinstance(data, dict) and "device" in data:
            data = upgrade_device_block(data)
        return data

    study: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="study id (folder name)")
    title: str = Field(..., description="report title")
    language: Literal["en", "ja"] = Field("en", description="report prose language")
    translations: list[Literal["en", "ja"]] = Field(
        default_factory=list, description="also publish the report in these languages (index.<lang>.html)")
    texts: dict[Literal["en", "ja"], StudyTexts] = Field(
        default_factory=dict, description="title, description and labels in another language, for translations")
    description: str | None = Field(None, description="what the study asks")
    host: HostParams = Field(default_factory=LocalHostParams, description="where the engine runs (by kind)")
    engine: EngineParams = Field(default_factory=EngineParams, description="engine set-up shared by configurations")
    workload: Workload = Field(..., description="what is sent")
    slo: Slo = Field(default_factory=Slo, description="service-level objective for goodput")
    design: Design = Field(default_factory=lambda: Design(),
                           description="how the configurations are measured: interleaved, sampled within a time budget")
    cost: CostParams | None = Field(None, description="prices and cost model for the write-up")
    configurations: list[Configuration] = Field(..., min_length=1, description="ordered, one change at a time")
    placement: Placement = Field(default_factory=lambda: Placement(),
                                 description="where the engines run: the machine's GPUs (lanes, groups, all-GPU "
                                 "configurations) or its CPU")
    peers: dict[str, list[PeerRun]] = Field(
        default_factory=dict, description="configuration id -> peer benchmark tools run on its server after its "
        "workload (`vllm bench serve`, SGLang's bench_serving; results under peer/<id>/)")
    checks: dict[str, list[Literal["quality", "speculative"]]] = Field(
        default_factory=dict, description="configuration id -> real-weights checks run on its server instead of its "
        "workload (quality: the quality set one at a time, quality.json; speculative: n-gram acceptance, "
        "speculative.jsonl)")
    capacity_runs: dict[str, list[str]] = Field(
        default_factory=dict, description="configuration id -> `servelab capacity` options run on its server after "
        "its workload (run folder <id>-capacity)")
    followups: Followups | None = Field(None, description="run `servelab explain` for every surprise after the "
                                                           "report, each follow-up within its own time budget")
    explains: Explains | None = Field(None, description="a follow-up study: the published study and configuration "
                                                       "whose surprise it explains (the Why section reads its reference)")
    quality: QualityParams = Field(default_factory=QualityParams,
                                   description="the output check after each configuration (measure.quality)")
    capacity: CapacityParams | None = Field(
        None, description="search every configuration's capacity at the SLO instead of its fixed grid "
                          "(a configuration's own capacity block wins)")
    tune: TuneParams | None = Field(None, description="search engine flags one at a time from a base configuration")
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
        for block, named in (("placement", self.placement.named), ("peers", list(self.peers)),
                             ("checks", list(self.checks)), ("capacity_runs", list(self.capacity_runs))):
            bad = sorted(set(named) - set(ids))
            if bad:
                raise ValueError(f"{block}: unknown configuration(s) {bad}; have {ids}")
        if self.tune is not None:
            base = self.tune.base or ids[0]
            if base not in ids:
                raise ValueError(f"tune.base: {base!r} is not a configuration; have {ids}")
            if self.tune.objective in ("capacity", "goodput") and self.capacity_for(base) is None:
                raise ValueError(f"tune.objective {self.tune.objective!r} needs a capacity: block (study or {base})")
        if isinstance(self.host, LocalHostParams) and self.engine.model is None:
            raise ValueError("a local host needs engine.model (preset or path)")
        errs = validate_engines(self) + placement_problems(self)
        if errs:
            raise ValueError("\n".join(errs))
        return self

    def in_language(self, lang: str) -> "Study":
        """The study written up in `lang`: its language set, its title, description and labels
        from `texts[lang]` where given."""
        t = self.texts.get(lang)
        update: dict[str, Any] = {"language": lang}
        if t is not None:
            update["title"] = t.title or self.title
            update["description"] = t.description or self.description
            update["configurations"] = [c.model_copy(update={"label": t.labels.get(c.id, c.label)})
                                        for c in self.configurations]
        return self.model_copy(update=update)

    def reduced_copy(self) -> "Study":
        """The same study with the `reduced` workload overrides applied."""
        data = self.model_dump()
        data["workload"] = _merge(data["workload"], self.reduced)
        data["quality"]["reference"] = False  # the model's own answers cost ~30 s to make: not for CI
        return Study.model_validate(data)

    def config(self, config_id: str) -> Configuration:
        for c in self.configurations:
            if c.id == config_id:
                return c
        raise KeyError(f"study {self.study!r} has no configuration {config_id!r}; have {[c.id for c in self.configurations]}")

    def workload_for(self, config_id: str) -> Workload:
        """The study's workload with the configuration's overrides (usually none)."""
        return Workload.model_validate(_merge(self.workload.model_dump(), self.config(config_id).workload))

    def capacity_for(self, config_id: str) -> CapacityParams | None:
        """The capacity search of a configuration (its own block, else the study's), or None."""
        return self.config(config_id).capacity or self.capacity

    def engine_for(self, config_id: str) -> EngineParams:
        return resolve_engine(self.engine, self.config(config_id))

    def same_model(self, a: str, b: str) -> bool:
        """Whether two configurations serve the same model (only those compare by default)."""
        return self.engine_for(a).model == self.engine_for(b).model

def validate_engines(study: "Study") -> list[str]:
    """Every engine problem of every configuration, prefixed with where it is ([] = fine):
    the engine profiles' flag tables and conflicts (`servelab.engines`)."""
    from ..engines import validate_engine  # engines loads httpx: servelab.schema imports without it (test_structure)

    out = [f"engine: {e}" for e in validate_engine(study.engine.kind, study.engine.args, study.engine.env)]
    base = set(out)
    for i, c in enumerate(study.configurations):
        eng = study.engine_for(c.id)
        for e in validate_engine(eng.kind, eng.args, eng.env, study.workload_for(c.id).concurrency):
            if f"engine: {e}" not in base:
                out.append(f"configurations[{i}] ({c.id}): engine: {e}")
    return out

def layout_of(study: "Study", config_id: str) -> Any:
    """The configuration's parallel layout (`engines.Layout`: TP, PP, DP, EP and the GPUs it takes)."""
    from ..engines import get  # not at the top: engines loads httpx (see validate_engines)

    eng = study.engine_for(config_id)
    return get(eng.kind).layout(eng.args)


def placement_problems(study: "Study") -> list[str]:
    """A configuration whose layout needs more GPUs than `placement.gpus`, or more than the one GPU a lane
    or a group gives it, one line each ([] = fine). The machine itself is held against the study when it
    runs (`servelab.placement`)."""
    pl = study.placement
    one = {c for lane in pl.lanes for c in lane} | {c for g in pl.groups for c in g}
    out = []
    for i, c in enumerate(study.configurations):
        try:
            lay = layout_of(study, c.id)
        except (TypeError, ValueError):
            continue  # a size that is not an integer: the engine's value check says so
        where = f"configurations[{i}] ({c.id}): layout {lay.label()} needs {lay.gpus} GPUs"
        if pl.gpus is not None and lay.gpus > max(pl.gpus, 1):
            out.append(f"{where}, placement.gpus is {pl.gpus}")
        elif lay.gpus > 1 and c.id in one:
            out.append(f"{where}; a lane or a group gives it one (list it in placement.all_gpus)")
    return out


def attach_problems(study: "Study") -> list[str]:
    """An attached study measures whatever answers at its URL under every configuration's name: configurations
    whose engine settings differ but share one URL would label one server as several settings. One line naming
    them ([] = fine: one engine, or each configuration names its own `url`)."""
    if not isinstance(study.host, AttachHostParams):
        return []
    shared = [c.id for c in study.configurations if c.url is None]
    engines = {json.dumps(study.engine_for(c).model_dump(exclude={"port"}), sort_keys=True, default=str)
               for c in shared}
    if len(engines) < 2:
        return []
    return [f"host: attach sends every configuration to {study.host.attach.url}, but the engine settings of "
            f"{', '.join(shared)} differ: one server would be measured under {len(shared)} names. Give each "
            "configuration its own url (configurations[].url), or let servelab start each engine (host: local)"]


def resolve_profile(study: "Study", config_id: str) -> "EngineParams":
    """The configuration's EngineParams with the profile's derived values applied (what launches)."""
    from ..engines import get  # not at the top: engines loads httpx (see validate_engines)

    eng = study.engine_for(config_id)
    return eng.model_copy(update={"args": get(eng.kind).apply_derived(eng.args, study.workload_for(config_id).concurrency)})

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

class ParamsError(UserError, ValueError):
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

Table = TypeVar("Table", bound=BaseModel)


def format_errors(path: str | Path, err: ValidationError, model: type[BaseModel] = Study) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"])
        if len(loc) > 1 and loc[0] == "host" and loc[1] in HOST_KINDS:
            loc = loc[:1] + loc[2:]  # the union's tag is not a key the user wrote
        if e["type"] == "union_tag_invalid":
            loc, e = loc + ("kind",), {**e, "type": "literal_error",
                                        "msg": "Input should be " + _one_of(HOST_KINDS), "input": e["input"].get("kind")}
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

def parse_table(model: type[Table], data: Any, source: str) -> Table:
    """A shipped table (the levers, the tools' definitions) from its mapping; ParamsError naming the key
    path on any problem."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_errors(source, e)) from None


def read_table(model: type[Table], path: Path) -> Table:
    """A shipped table from its YAML file (`parse_table`, errors naming the file)."""
    return parse_table(model, yamlio.safe_load(Path(path).read_text(encoding="utf-8")), str(path))


def _one_of(values: tuple[str, ...]) -> str:
    q = [f"'{v}'" for v in values]
    return ", ".join(q[:-1]) + f" or {q[-1]}"

def _read_mapping(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ParamsError(f"{path}: no such params file")
    try:
        data = yamlio.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path}:{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        raise ParamsError(f"{path}: params file is empty (a study needs at least study, title, workload and "
                          "configurations)")
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: <top>: expected a mapping of keys, got {type(data).__name__}")
    return data


def load_study(path: str | Path) -> Study:
    """Read and validate a study file. Raises ParamsError naming file, key and expectation (also for an
    attached study whose differing configurations share one URL: `attach_problems`)."""
    path = Path(path)
    data = _read_mapping(path)
    try:
        study = Study.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_errors(path, e)) from None
    problems = attach_problems(study)
    if problems:
        raise ParamsError("\n".join(f"{path}: {p}" for p in problems))
    return study


class WorkloadBlock(Strict):
    """A file holding only a `workload:` block (what `servelab workload from-log` writes)."""

    workload: Workload = Field(..., description="what is sent")


def load_params(path: str | Path) -> "Study | WorkloadBlock":
    """A study file, or a file with only a `workload:` block; ParamsError as `load_study`."""
    path = Path(path)
    data = _read_mapping(path)
    if set(data) != {"workload"}:
        return load_study(path)
    try:
        return WorkloadBlock.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_errors(path, e, WorkloadBlock)) from None


FORMAT_VERSION = 3
"""The format of study.json and run.json this code writes (their `format_version`). 1, never
written: servelab 0.1's files, which carry no version (published reports keep loading)."""


def upgrade(data: dict[str, Any], format_version: int | None = None) -> dict[str, Any]:
    """The study of a study.json written in `format_version` (its file's `format_version`; None
    for a file without one) in today's shape. Version 1 (servelab 0.1, published reports): the
    host carried every kind's block (`attach: null`, `aws: null`) and `aws.mode` repeated the
    host kind. Version 2: `run_noise_pct`, replaced by `design`. Raises ParamsError for a format newer than this code."""
    version = 1 if format_version is None else int(format_version)
    if version > FORMAT_VERSION:
        raise ParamsError(f"study.json format_version {version} is newer than this servelab ({FORMAT_VERSION})")
    if version == FORMAT_VERSION:
        return data
    if version < 2:
        host = {k: v for k, v in (data.get("host") or {}).items() if v is not None}
        if isinstance(host.get("aws"), dict):
            host["aws"] = {k: v for k, v in host["aws"].items() if k != "mode"}
        data = {**data, "host": host} if "host" in data else data
    # version 2: `run_noise_pct` (the largest change of one A/A pair) is no estimate of anything the
    # verdicts use now (analysis.verdicts); it is dropped, and a study without repeats says so
    return {k: v for k, v in data.items() if k != "run_noise_pct"}


def study_from_dict(data: dict[str, Any], source: str = "<params>") -> Study:
    try:
        return Study.model_validate(data)
    except ValidationError as e:
        raise ParamsError(format_errors(source, e)) from None


__all__ = ["Study", "Design", "ParamsError", "FORMAT_VERSION", "load_study", "study_from_dict", "upgrade", "format_errors", "validate_engines",
           "placement_problems", "attach_problems", "upgrade_device_block", "layout_of",
           "resolve_profile", "resolve_engine", "GPU_AMI_PARAMETER", "HOST_KINDS", "HOURS_PER_MONTH", "AttachHostParams",
           "AttachParams", "AwsEcsHostParams", "AwsInstanceHostParams", "AwsParams", "Bucket", "Configuration",
           "CostParams", "Placement", "CHECKS", "PeerRun", "StudyTexts", "QualityParams", "EngineParams", "HostParams", "LocalHostParams", "ModelRef", "Slo", "Strict", "Workload",
           "RampUp", "SessionTemplate", "TraceSource", "WorkloadBlock", "load_params",
           "CapacityParams", "TuneFlag", "TuneParams"]
