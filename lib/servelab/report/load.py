"""A published study, loaded once for the write-up: the typed `Study` it ran, and per
configuration its `RunFolder` (records, summary, server samples, run.json, read lazily and
once). Everything in `report/` is a pure function of these files; no server is contacted."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from ..engines import get as engine_profile
from ..analysis import verdicts
from ..runfolder import RECORDS, STUDY_JSON, RunFolder, read_design, read_json, read_jsonl, resolve
from ..schema import Study, study_from_dict, upgrade
from ..schema.runfiles import DesignRecord, RunInfo
from ..summary import summarize
from .i18n import Words, words


@dataclass
class StudyData:
    """A published study: the typed Study, and per measured configuration its run folder."""

    root: Path
    study: Study
    folders: dict[str, RunFolder] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # study.json beside the study (e.g. its GPU sessions)
    files: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)  # what `file` and `folder` read

    @property
    def language(self) -> str:
        return self.study.language

    @property
    def w(self) -> Words:
        """The report's words in its language: `sd.w("key", value=...)`."""
        return words(self.language)

    def with_language(self, lang: str) -> "StudyData":
        """The same data written up in another language."""
        return StudyData(self.root, self.study.in_language(lang), self.folders, self.meta, self.files)

    @property
    def data_dir(self) -> Path:
        """Where the study's files are: data/ of a published report, else the runs/<study> folder."""
        return self.root / "data" if (self.root / "data").is_dir() else self.root

    def file(self, name: str, folder: str = "") -> Any:
        """A JSON (or, for `.jsonl`, JSON-lines) file beside the configurations (`folder` "": tune.json)
        or in one folder (a configuration's quality.json, a capacity search's run.json), read once;
        None where there is none. Also a folder without records (a check-only configuration)."""
        key = (folder, name)
        if key not in self.files:
            p = self.data_dir / folder / name
            self.files[key] = None if not p.exists() else read_jsonl(p) if name.endswith(".jsonl") else read_json(p)
        return self.files[key]

    def folder(self, name: str) -> RunFolder:
        """A folder of the study read once, measured or not (a `<config>-capacity` search)."""
        if name in self.folders:
            return self.folders[name]
        key = (name, "/")  # no file name ends in "/"
        if key not in self.files:
            self.files[key] = RunFolder(self.data_dir / name)
        return self.files[key]

    @property
    def config_ids(self) -> list[str]:
        return [c.id for c in self.study.configurations if c.id in self.folders]

    @property
    def runs(self) -> dict[str, dict[str, Any]]:
        """Each configuration's run.json as written (validated); `info` is the typed one."""
        return {cid: rf.run for cid, rf in self.folders.items()}

    def info(self, cid: str) -> RunInfo:
        """The configuration's run.json, typed (`schema.runfiles.RunInfo`; empty where none)."""
        rf = self.folders.get(cid)
        return rf.info if rf is not None else RunInfo()

    def labels(self) -> dict[str, str]:
        return {c.id: c.label or c.id for c in self.study.configurations}

    @cached_property
    def colors(self) -> dict[str, str]:
        """One colour per configuration for every figure of the report."""
        from .plots import config_colors

        return config_colors([c.id for c in self.study.configurations])

    @cached_property
    def rounds(self) -> pd.DataFrame:
        from ..summary import round_throughput

        return round_throughput(self.records)

    @cached_property
    def records(self) -> pd.DataFrame:
        frames = [self.folders[c].records for c in self.config_ids if not self.folders[c].records.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cached_property
    def summary(self) -> pd.DataFrame:
        return summarize(self.records, [r for c in self.config_ids for r in self.folders[c].levels],
                         rounds=self.rounds)  # the round table is computed once

    def samples(self, cid: str) -> pd.DataFrame | None:
        return self.folders[cid].samples if cid in self.folders else None

    def facts(self, cid: str) -> dict[str, Any]:
        return self.info(cid).facts

    def engine_params(self, cid: str) -> dict[str, Any]:
        return self.runs[cid].get("engine_params") or {}

    @cached_property
    def design(self) -> DesignRecord:
        """How the configurations were measured (design.json; not the params' `study.design`)."""
        return read_design(self.root / "data", self.root)


def load_study_data(study_dir: str | Path) -> StudyData:
    """Read `<study_dir>/data/` (a published report) or a runs/<study> folder."""
    root = resolve(study_dir)
    data = root / "data" if (root / "data").is_dir() else root
    sj = read_json(data / STUDY_JSON)
    study = study_from_dict(upgrade(sj["study"], sj.get("format_version")), str(data / STUDY_JSON))
    folders = {c.id: RunFolder(data / c.id) for c in study.configurations if (data / c.id / RECORDS).exists()}
    meta = {k: v for k, v in sj.items() if k not in ("study", "device")}
    if sj.get("device") and "sessions" not in meta:  # written before 2026-12-06 as `device`
        meta["sessions"] = [{k: d[k] for k in SESSION_KEYS if k in d} for d in sj["device"]]
    return StudyData(root=root, study=study, folders=folders, meta=meta)


#: what a study.json's `sessions` entry says of one GPU session: its date, the machine, what ran and the start-ups
SESSION_KEYS = ("date", "machine", "configurations", "startup_s", "startup_group")


def engine_layout(sd: StudyData, config_id: str) -> Any:
    """The parallel layout the configuration's engine ran with (`engines.Layout`, from the args it ran with)."""
    ep = sd.engine_params(config_id)
    return engine_profile(ep.get("kind", "vllm")).layout(ep.get("args") or {})


def engine_gpus(sd: StudyData, config_id: str) -> int:
    """GPUs the configuration's engine spanned (its layout's: TP x PP x DP, DP attention inside the TP group)."""
    return engine_layout(sd, config_id).gpus


def baselines(sd: StudyData, piv: pd.DataFrame | None = None, *, every: bool = False) -> dict[str, str]:
    """Each measured configuration's baseline (`analysis.verdicts.baselines`, the rule the measurement
    used) on the levels each measured; `every`: each configuration of the study's, a check-only one (no
    levels) keeping the baseline its params name."""
    if piv is None and not sd.summary.empty:
        piv = sd.summary.pivot_table(index=["bucket", "concurrency"], columns="config", values="aggregate_output_tps",
                                     aggfunc="first", sort=False)
    cols = [c for c in sd.config_ids if piv is not None and c in piv.columns]
    measured = {c: set(piv.index[piv[c].notna()]) for c in cols}
    named = {c.id: c.baseline for c in sd.study.configurations}
    ids = [c.id for c in sd.study.configurations] if every else cols
    return verdicts.baselines(ids, named, sd.study.same_model, measured)
