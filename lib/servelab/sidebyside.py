"""A study's configurations measured side by side: every engine started two at a time (once the
first is up, its memory checked against the rest), the quality checks two engines at a time, the
interleaved benchmark with sequential sampling in the study's time budget (notebook 03 with
`configs`: `stages.benchmark_interleaved`), every engine stopped, each configuration diagnosed.
`interleave_blocked` says why a study cannot be measured this way. Not for one configuration at a
time (`pipeline.run_config`) nor for the statistics (`analysis.verdicts`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import psutil
import yaml

from .execute import STAGES, StageFailed, StageParams, Stopped, close_partial, log, run_stage, stop_children
from .hosts import EngineError
from .hosts.process import tree_rss_bytes
from .measure.machine import LaunchWatch
from .measure.pools import worker_count
from .plan import ConfigPlan, load_plan, plan_config
from .runfolder import ENGINE_JSON, PARAMS_EFFECTIVE, RunFolder, read_engine, write_design
from .schema import Study
from .schema.runfiles import DesignRecord, LaunchTimes

def write_effective(study: Study, rdir: Path) -> Path:
    """The study as validated here (--reduced and --url applied, ports assigned) for the notebooks."""
    rdir.mkdir(parents=True, exist_ok=True)
    effective = rdir / PARAMS_EFFECTIVE
    effective.write_text(yaml.safe_dump(json.loads(study.model_dump_json()), sort_keys=False))
    return effective


def interleave_blocked(study: Study, todo: list[ConfigPlan], resume: bool) -> str | None:
    """Why these configurations cannot be measured side by side and interleaved (None: they can;
    whether their engines fit in memory is checked once the first one runs)."""
    if study.design.interleave == "off":
        return "design.interleave is off"
    if len(todo) < 2:
        return "one configuration"
    if resume:
        return "--resume continues one configuration at a time"
    if not todo[0].host.side_by_side:
        return f"the {todo[0].host.kind} host runs one engine at a time"
    if any(study.capacity_for(p.config_id) is not None for p in todo):
        return "a capacity search chooses its own levels"
    if any(p.workload != todo[0].workload for p in todo[1:]):
        return "the configurations send different workloads"
    if worker_count(todo[0].workload.workers) != 1:
        return "the client sends from several worker processes"
    return None


def with_ports(study: Study, ids: list[str]) -> Study:
    """The study with each of `ids` on its own port (the engine's port + its index): engines that
    run side by side cannot share one. Ports are not settings a change compares (compare.config_diff)."""
    base = {c: study.engine_for(c).port for c in ids}
    confs = [c.model_copy(update={"engine": {**c.engine, "port": base[c.id] + ids.index(c.id)}}) if c.id in ids else c
             for c in study.configurations]
    return study.model_copy(update={"configurations": confs})


def fits_side_by_side(rdir: Path, n: int, headroom_bytes: float = 2**30) -> tuple[bool, str]:
    """Whether n engines like the one running for `rdir` fit in this machine's free memory (its
    resident memory now, 15 % more each for growth, and `headroom_bytes`), with the numbers."""
    pid = read_engine(rdir / ENGINE_JSON).get("pid")
    rss = tree_rss_bytes(pid) if pid else 0
    free = psutil.virtual_memory().available
    need = rss * (n - 1) * 1.15 + headroom_bytes
    gib = 2.0**30
    text = (f"one engine holds {rss / gib:.2f} GiB; {n - 1} more need {need / gib:.1f} GiB with headroom, "
            f"{free / gib:.1f} GiB free")
    return bool(rss and need <= free), text


def _launch_stages(plan: ConfigPlan, effective: Path, rdir: Path, notebooks: bool) -> float:
    """Provision and launch one configuration and leave its engine running (its quality check waits
    for the interleaved benchmark: two engines decoding at once on this CPU slow each other down
    tens of times, measured: 1-9 tok/s instead of ~40); returns the seconds it took. Raises StageFailed."""
    t0 = time.monotonic()
    p = StageParams(effective, plan.config_id, rdir, check_quality=False)
    for name in STAGES[:2]:
        run_stage(name, plan, p, notebooks=notebooks)
    return time.monotonic() - t0


def _launch_in_worker(params_path: str, config_id: str, rdir: str, notebooks: bool) -> float:
    """`_launch_stages` in a worker process (its own plan and host, rebuilt from the study file)."""
    return _launch_stages(load_plan(params_path, config_id), Path(params_path), Path(rdir), notebooks)


def _diagnose_in_worker(params_path: str, config_id: str, rdir: str) -> None:
    run_stage(STAGES[3], None, StageParams(Path(params_path), config_id, Path(rdir)), notebooks=True)


LANES = 2  # engines started at once: start-up is mostly one busy core (imports, compilation)


def _launch_all(plans: list[ConfigPlan], effective: Path, root: Path, notebooks: bool
                ) -> tuple[LaunchTimes, bool, str]:
    """Launch `plans` two at a time (each lane takes the next configuration when its last is up),
    watching what else used the CPU meanwhile (`LaunchWatch`). When the first engine is up, check
    that all of them fit in memory side by side; if not, launch nothing more. Returns (the launch:
    its wall time, each configuration's start-up and when, the disturbed windows; fits, the memory check)."""
    took: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    t0 = time.monotonic()
    # the long start-ups (compilation) first, so the two lanes end close together
    queue = sorted(plans, key=lambda p: not p.profile.compiles_at_startup(p.engine.args))
    fits, why = True, ""
    with LaunchWatch() as watch, ProcessPoolExecutor(min(LANES, len(plans))) as pool:
        running = {}
        begun: dict[str, float] = {}

        def submit() -> None:
            p = queue.pop(0)
            running[pool.submit(_launch_in_worker, str(effective), p.config_id, str(root / p.config_id),
                                notebooks)] = p.config_id
            begun[p.config_id] = time.time()

        for _ in range(min(LANES, len(queue))):
            submit()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                cid = running.pop(f)
                took[cid] = f.result()  # StageFailed / EngineError travel here
                spans[cid] = (begun[cid], time.time())
                log(f"{cid}: launched in {took[cid]:.1f} s")
                if len(took) == 1:
                    fits, why = fits_side_by_side(root / cid, len(plans))
                    log(f"engines side by side: {why}" if fits else f"configurations measured one at a time: {why}")
                if fits and queue:
                    submit()
    windows = watch.windows(spans)
    for w in windows:
        log(f"engine starts disturbed: other processes took up to {w['busy_cpu']:.1f} cores for "
            f"{w['to'] - w['from']:.0f} s (the starts of {', '.join(w['starts']) or 'none'})")
    return LaunchTimes(wall_s=time.monotonic() - t0, per_config_s=took,
                       spans={c: [round(a, 3), round(b, 3)] for c, (a, b) in spans.items()}, windows=windows), fits, why


def measure_interleaved(study: Study, todo: list[ConfigPlan], root: Path, *, notebooks: bool,
                        started: float | None, fallback: Callable[[Study, list[ConfigPlan], Path], list[str]]) -> list[str]:
    """Start every configuration's engine two at a time (the memory of all checked once the first is
    up), measure them interleaved with sequential sampling within `design.budget_s` (counted from
    `started`, time.monotonic()), stop them, diagnose each. Falls back to one at a time when the
    engines do not fit side by side."""
    ids = [p.config_id for p in todo]
    study = with_ports(study, ids)
    host = todo[0].host
    plans = [plan_config(study, cid, host) for cid in ids]
    effective = None
    for cid in ids:
        effective = write_effective(study, root / cid)
    assert effective is not None
    t0 = time.monotonic()
    started = started if started is not None else t0
    deadline = (time.time() + study.design.budget_s - (t0 - started)) if study.design.budget_s else None
    launched = [root / c for c in ids]  # stopped on every exit path (a handle not written is no engine)
    try:
        log(f"configurations {', '.join(ids)}: starting {LANES} at a time, to be measured side by side")
        launch, fits, why = _launch_all(plans, effective, root, notebooks)
        if not fits:
            for rdir in launched:
                log(f"{rdir.name}: {host.stop(rdir)}")
            write_design(root, DesignRecord(interleaved=False, reason=why))
            return fallback(study, plans, root)
        write_design(root, DesignRecord(interleaved=True, lanes=LANES, memory=why, launch=launch))
        t1 = time.monotonic()
        run_stage(STAGES[2], plans[0], StageParams(effective, ids[0], root / ids[0], configs=tuple(ids),
                                                   deadline_unix=deadline or 0.0),
                  notebooks=notebooks, together=plans, where=root / "notebooks")
        log(f"interleaved benchmark of {len(ids)} configurations done in {time.monotonic() - t1:.1f} s")
    except (StageFailed, EngineError) as e:
        log(str(e))
        return [c for c in ids if RunFolder(root / c).run.get("status") != "complete"]
    except KeyboardInterrupt as e:
        reason = e.name if isinstance(e, Stopped) else "the user (Ctrl-C)"
        stop_children()
        for rdir in launched:
            close_partial(rdir, reason)
        raise
    finally:
        for rdir in launched:
            log(f"{rdir.name}: {host.stop(rdir)}")
    return _diagnose_all(plans, effective, root, notebooks)


def _diagnose_all(plans: list[ConfigPlan], effective: Path, root: Path, notebooks: bool) -> list[str]:
    """04_diagnose for each configuration (files only), two at a time; the configurations whose
    run did not complete."""
    if notebooks:
        with ProcessPoolExecutor(LANES) as pool:
            for f in [pool.submit(_diagnose_in_worker, str(effective), p.config_id, str(root / p.config_id))
                      for p in plans]:
                f.result()
    failed = []
    for plan in plans:
        run = RunFolder(root / plan.config_id).run
        if run.get("status") != "complete":
            log(f"{plan.config_id}: run {run.get('status', 'missing')}: {run.get('message', '')}")
            failed.append(plan.config_id)
    return failed
