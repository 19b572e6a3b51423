"""Tuning: a coordinate search over engine flags that reuses the study's pieces (start the engine,
run the capacity search, quality check, keep or reject).

From the base configuration, each flag of `tune:` in turn, each of its values: one new
configuration (the incumbent's engine with that one flag changed, `baseline:` the incumbent),
measured by `execute.run_config` like any configuration; kept only when its objective beats the
incumbent's beyond noise (`analysis.tuning.decide`) and its quality holds. A candidate whose
engine does not start is recorded with the engine's reason. The candidates become the study's
configurations (study.json), so the report's progression and tables show them; `tune.json`
holds the story (each step, its gain and interval, kept or rejected). `resume` continues after
the last finished step. Not for the search rules (`analysis.tuning`) or the words (`report`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from .log import progress_line
from .analysis.tuning import REASON_CHARS, clip, decide, objective, quality_verdict
from .hosts import EngineError, Host, for_study
from .measure.capacity import from_params, worst_case, worst_case_line
from .execute import RunIncomplete, StageFailed, run_config, stop_signals
from .pipeline import describe, publish
from .plan import plan_config
from .runfolder import (ENGINE_LOG, PARAMS_EFFECTIVE, QUALITY_JSON, STUDY_JSON, TUNE_JSON, RunFolder, now_iso, read_json,
                        runs_root, write_json)
from .schema import Study


def _log(msg: str) -> None:
    progress_line(msg)


def _quality(run_dir: Path) -> dict[str, Any] | None:
    """A run folder's quality.json, None where it has none."""
    return read_json(run_dir / QUALITY_JSON) if (run_dir / QUALITY_JSON).exists() else None


def candidate_id(flag: str, value: Any) -> str:
    v = json.dumps(value) if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9_.]+", "-", f"{flag}-{v}").strip("-")


def with_candidate(study: Study, base_id: str, cid: str, flag: str, value: Any, label: str,
                   start: float | None = None) -> Study:
    """The study with one more configuration: `base_id`'s engine with `flag` set to `value`; its
    capacity search starts at `start` (the incumbent's capacity: fewer trials to bracket it)."""
    data = json.loads(study.model_dump_json())
    base = next(c for c in data["configurations"] if c["id"] == base_id)
    eng = json.loads(json.dumps(base.get("engine") or {}))
    eng.setdefault("args", {})[flag] = value
    conf: dict[str, Any] = {"id": cid, "label": label, "engine": eng, "baseline": base_id,
                            "note": f"tune candidate: {flag} = {value} on {base_id}"}
    cap = study.capacity_for(base_id)
    if cap is not None and start:
        conf["capacity"] = {**cap.model_dump(), "start": min(max(start, cap.min_load), cap.max_load)}
    data["configurations"].append(conf)
    return Study.model_validate(data)


def worst_case_lines(study: Study) -> list[str]:
    """What a tune costs at most: one engine start per candidate (and the base), each a capacity search."""
    t = study.tune
    n = 1 + min(len(t.candidates()), t.max_candidates)
    base = t.base or study.configurations[0].id
    cap = study.capacity_for(base)
    if cap is None:
        return [f"tune: {n} engine starts (base + candidates), objective {t.objective}"]
    spec, shape = from_params(cap, study.workload_for(base).buckets)
    return [f"tune: {n} engine starts (base + {n - 1} candidates), each a capacity search: "
            + worst_case_line(worst_case(spec, shape, server_starts=n))]


def start_failure(rdir: Path, err: Exception | None = None) -> str:
    """The engine's own reason from its log: the first exception line of a traceback (the root
    cause; vLLM's engine core raises it before the generic 'initialization failed'), else the
    last error line, else the exception."""
    log = rdir / ENGINE_LOG
    if log.exists():
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
        roots = [x for x in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", x)]
        if roots:
            return clip(roots[0])
        errs = [x for x in lines if re.search(r"Error|error:|Exception", x)]
        if errs:
            return errs[-1][-REASON_CHARS:]
    return clip(str(err).splitlines()[0]) if err else "the engine did not start"


class Tuner:
    """Runs the coordinate search of one study (see the module docstring)."""

    def __init__(self, study: Study, params_path: Path, host: Host, *, resume: bool = False) -> None:
        self.study, self.params_path, self.host, self.resume = study, params_path, host, resume
        self.t = study.tune
        self.root = runs_root() / study.study
        self.base = self.t.base or study.configurations[0].id
        prev = read_json(self.root / TUNE_JSON) if resume and (self.root / TUNE_JSON).exists() else None
        self.record: dict[str, Any] = prev or {
            "format_version": 1, "base": self.base, "objective": self.t.objective,
            "flags": [f.flag for f in self.t.flags], "started_at": now_iso(), "steps": []}
        if prev:  # the candidates measured so far are configurations of the study again
            for s in prev["steps"]:
                if s.get("flag") is not None:
                    self.study = with_candidate(self.study, s["incumbent"], s["config"], s["flag"], s["value"],
                                                s["label"], s.get("start"))
            self._share_study()

    def _share_study(self) -> None:
        """The host made for this tune serves every candidate: it reads their engines from the
        study, which gains one configuration per candidate."""
        self.host.study = self.study

    def _save(self) -> None:
        write_json(self.root / TUNE_JSON, self.record)
        write_json(self.root / STUDY_JSON, {"params_path": str(self.params_path), "reduced": False,
                                            "study": json.loads(self.study.model_dump_json())})

    def measure(self, cid: str) -> tuple[bool, str]:
        rdir = self.root / cid
        if rdir.exists():
            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        eff = rdir / PARAMS_EFFECTIVE
        eff.write_text(yaml.safe_dump(json.loads(self.study.model_dump_json()), sort_keys=False))
        try:
            run_config(plan_config(self.study, cid, self.host), eff, rdir, notebooks=False, reduced=False)
        except (StageFailed, EngineError, RunIncomplete, RuntimeError) as e:
            if RunFolder(rdir).run.get("capacity"):
                return True, ""  # measured, only short of its search's stop rule (budget): use what it found
            why = start_failure(rdir, e)
            failed = rdir.with_name(f"{cid}-failed")  # published beside the runs (its engine log)
            if failed.exists():
                shutil.rmtree(failed)
            rdir.rename(failed)
            return False, why
        return True, ""

    def _objective(self, cid: str) -> dict[str, Any]:
        rf = RunFolder(self.root / cid)
        return objective(rf.run, rf.records, self.t.objective)

    def _step(self, **kw: Any) -> dict[str, Any]:
        self.record["steps"].append({"at": now_iso(), **kw})
        self._save()
        return self.record["steps"][-1]

    def run(self) -> dict[str, Any]:
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.params_path, self.root / "params.yaml")
        done = {(s.get("flag"), json.dumps(s.get("value"))) for s in self.record["steps"]}
        if not self.record["steps"]:
            ok, why = self.measure(self.base)
            if not ok:
                raise EngineError(f"tune: the base configuration {self.base} did not start: {why}")
            o = self._objective(self.base)
            self._step(config=self.base, label=self.study.config(self.base).label or self.base, flag=None, value=None,
                       incumbent=None, objective=o["value"], interval=o["interval"], verdict="base")
        inc = next((s["config"] for s in reversed(self.record["steps"]) if s["verdict"] in ("base", "kept")))
        for flag, value in self.t.candidates()[: self.t.max_candidates]:
            if (flag, json.dumps(value)) in done:
                continue
            cid = candidate_id(flag, value)
            label = f"{flag} {value}"
            start = self._objective(inc)["value"] or None
            self.study = with_candidate(self.study, inc, cid, flag, value, label, start)
            self._share_study()
            self._save()
            t0 = time.monotonic()
            ok, why = self.measure(cid)
            if not ok:
                self._step(config=cid, label=label, flag=flag, value=value, incumbent=inc, start=start, verdict="failed",
                           why="start_failed", why_values={"reason": why}, elapsed_s=time.monotonic() - t0)
                _log(f"tune: {cid} failed to start: {why}")
                continue
            o, oi = self._objective(cid), self._objective(inc)
            verdict, reason, gain, giv = decide(o, oi)
            q = quality_verdict(_quality(self.root / cid), _quality(self.root / inc))
            extra: dict[str, Any] = {}
            if verdict == "kept" and q is not None and (q.get("changed") or q.get("score_dropped")):
                verdict, reason = "flagged", "quality"
                extra["why_values"] = {"detail": f"{q['identical']}/{q['total']} outputs identical"}
            self._step(config=cid, label=label, flag=flag, value=value, incumbent=inc, start=start, objective=o["value"],
                       interval=o["interval"], incumbent_interval=oi["interval"], gain_pct=gain,
                       gain_interval_pct=giv, verdict=verdict, why=reason, quality=q,
                       elapsed_s=time.monotonic() - t0, **extra)
            _log(f"tune: {cid} {verdict} ({reason}): {o['interval']} vs {inc} {oi['interval']}")
            if verdict == "kept":
                inc = cid
        base_o = self.record["steps"][0]["objective"]
        fin = self._objective(inc)
        self.record["final"] = {"config": inc, "objective": fin["value"],
                                "gain_pct": (fin["value"] - base_o) / base_o * 100.0 if base_o else None}
        self.record["finished_at"] = now_iso()
        self._save()
        return self.record


def run_tune(study: Study, params_path: Path, *, force: bool = False, resume: bool = False, dry_run: bool = False,
             report: bool = True) -> int:
    """`servelab run` for a study with a `tune:` block. Returns an exit status."""
    if dry_run:
        print(describe(study))
        print("\n".join(worst_case_lines(study)))
        return 0
    root = runs_root() / study.study
    if root.exists() and not resume:
        if not force:
            raise FileExistsError(f"{root} exists (runs are immutable): pass --force to tune again or --resume")
        shutil.rmtree(root)
    for text in worst_case_lines(study):
        _log(text)
    host = for_study(study)
    host.check()
    tuner = Tuner(study, params_path, host, resume=resume)
    try:
        with stop_signals(), host.guard():
            rec = tuner.run()
    finally:
        out = host.teardown()
        if out:
            _log(out)
    kept = [s["config"] for s in rec["steps"] if s["verdict"] == "kept"]
    _log(f"tune: final {rec['final']['config']} (kept {kept or 'nothing'})")
    if report:
        publish(study.study, root, force=True)
    return 0
