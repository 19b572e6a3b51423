"""Study orchestration: every configuration through the stage notebooks, then the report.

`run_study` measures the configurations side by side and interleaved where they can be
(`sidebyside`), else one after another: `notebooks/01_provision .. 04_diagnose` executed headless
with papermill for each configuration (`execute`; executed copies kept in the run folder), always
stopping the engine; then it publishes: raw runs copied to `reports/<study>/data/`, the write-up notebook executed and
converted to `reports/<study>/index.html`, `reports/index.html` updated. `render_reports`
re-renders published studies from their data alone (no server). SIGTERM and SIGHUP end a run
as Ctrl-C does: records kept, run.json partial with the reason, summary written, the engine
and its process group stopped, the host torn down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from . import forecast, views
from .analysis.cost import cost_estimate_lines
from .errors import RunFolderExists
from . import placement as placing
from .execute import StageFailed, WRITEUP, execute_notebook, log, run_config, stop_signals
from .hosts import EngineError, for_study
from .hosts.process import engine_python
from .measure.capacity import study_worst_case_lines
from .measure import hostprobe
from .measure.grid import planned_requests
from .plan import ConfigPlan, plan_study
from .preflight import preflight
from .report.i18n import words
from .report.index import write_index
from .report.load import load_study_data
from .report.render import notebook_to_html
from .report.verdicts import write_study_verdicts
from .runfolder import (CHECK_FILES, DESIGN_JSON, ENGINE_LOG, HOST_PROBE_JSON, PUBLISHED_FILES, RECORDS, STUDY_JSON,
                        RunFolder, read_json, reports_root, runs_root, write_design, write_json)
from .schema import FORMAT_VERSION, Study
from .schema.runfiles import DesignRecord
from .paths import portable, portable_tree
from .secrets import scrub_tree
from .sidebyside import LANES, interleave_blocked, measure_interleaved, with_ports, write_effective
from .schema import study_from_dict, upgrade
from .hosts.local import model_dir_for
from .lanes import done, measure_placed, placed_study
from .measure.inventory import Gpu, InventoryError, inventory, stand_in
from .prices import load_table
from .schema import layout_of
from .secrets import scrub
from .summary import format_table


class PublishedReportExists(RunFolderExists):
    """reports/<study>/index.html is published: --force replaces it."""


def describe(study: Study, only: list[str] | None = None) -> str:
    """What `--dry-run` prints (for `only` these configurations): the workload, where each engine runs, every
    launch command (shell-quoted), what the host will do, and the estimated cost. Starts nothing and calls
    nothing."""
    lines = [f"study {study.study}: {study.title}"]
    wl = study.workload
    n = planned_requests(wl)
    lines.append(f"workload: {len(wl.buckets)} buckets x concurrency {wl.concurrency}, "
                 f"{wl.warmup_rounds} warmup + {wl.rounds} rounds, {n} requests per configuration")
    plans = {c: p for c, p in plan_study(study).items() if not only or c in only}  # derived values filled in
    placed = dry_placement(study, list(plans))
    why = interleave_blocked(study, list(plans.values()), False) if placed is None or placed.cpu else "placed on GPUs"
    if placed is not None and not placed.cpu:
        plans = {c: p for c, p in plan_study(placed_study(study, placed), next(iter(plans.values())).host).items()
                 if c in plans}
        lines += placed.lines()
    elif why is None:  # the engines run side by side, each on its own port
        plans = {c: p for c, p in plan_study(with_ports(study, list(plans)), next(iter(plans.values())).host).items()
                 if c in plans}
        budget = f"; time budget {study.design.budget_s:g} s" if study.design.budget_s else ""
        lines.append(f"design: engines started {LANES} at a time and measured interleaved when they fit in memory "
                     f"(checked after the first starts), more rounds where a verdict is open{budget}")
    elif len(plans) > 1:
        lines.append(f"design: configurations measured one at a time ({why})")
    for cid, plan in plans.items():
        eng = plan.engine
        if eng.model is not None:
            lines += views.launch_plan(plan, python="python").splitlines()
            if eng.env:
                lines.append(f"[{cid}] env " + " ".join(shlex.quote(f"{k}={v}") for k, v in eng.env.items()))
        lines += layout_lines(plan)
    lines += next(iter(plans.values())).host.plan_lines({cid: p.engine for cid, p in plans.items()})
    gpu = placed.machine[0].name if placed is not None and placed.machine and placed.machine[0].source != "planned" else None
    lines += prediction_lines(study, list(plans), gpu)
    lines += study_worst_case_lines(study)
    lines += cost_estimate_lines(study)
    return "\n".join(lines)


def dry_placement(study: Study, ids: list[str]) -> placing.Placement | None:
    """Where the dry run shows the engines: placed on this machine's GPUs (or $SERVELAB_GPUS's, `--gpus`); for a
    study placed on GPUs on a machine without them, on as many GPUs of unknown size as it asks for; None where
    the engine does not run on this machine (an attached server, AWS); for a study whose runner runs on an AWS
    instance (`runner: instance`), on that instance type's GPUs."""
    host = for_study(study)
    if host.runs_remotely:
        machine = instance_gpus(study.host.aws.instance_type)
        return placing.plan(study, ids, machine, source=study.study) if machine else None
    if not host.engine_here:
        return None
    machine = inventory()
    if not machine and study.placement.on_gpus:
        widths = [study.placement.gpus or 1, *(layout_of(study, c).gpus for c in ids)]
        machine = [Gpu(i, "GPU", None, None, source="planned") for i in range(max(widths))]
    return placing.plan(study, ids, machine, source=study.study)


def instance_gpus(instance_type: str) -> list[Gpu]:
    """An instance type's GPUs as the placement sees them: the price table's count and GPU, the hardware table's
    memory ([] where either does not know it)."""
    row = next((e for e in load_table().get("ec2_on_demand", []) if e["instance_type"] == instance_type
                and e.get("gpus") and e.get("gpu")), None)
    if row is None:
        return []
    name = re.sub(r"\s+\d+\s*GB$", "", row["gpu"])  # "NVIDIA H200 141 GB": the hardware table's "NVIDIA H200"
    try:
        gpus = stand_in(f"{row['gpus']}x{name}")
    except InventoryError:
        return []
    return [dataclasses.replace(g, source="instance") for g in gpus]


def layout_lines(plan: ConfigPlan) -> list[str]:
    """The dry run's line on a configuration's parallel layout: its name, the GPUs it takes and the
    CUDA_VISIBLE_DEVICES it is started with where the placement gave it GPUs."""
    lay = plan.profile.layout(plan.engine.args)
    visible = plan.engine.env.get("CUDA_VISIBLE_DEVICES")
    where = f", CUDA_VISIBLE_DEVICES={visible}" if visible else ""
    return [f"[{plan.config_id}] layout {lay.label()}: {lay.gpus} GPU{'s' if lay.gpus > 1 else ''}{where}"]


def prediction_lines(study: Study, ids: list[str], gpu: str | None = None) -> list[str]:
    """The dry run's predictions of a study placed on GPUs (on `gpu`, the machine's, else the newest calibrated
    GPU; `servelab predict` for another machine), per configuration, each figure an estimate or a bound and why;
    [] for other studies (a local study's machine is probed when it runs)."""
    if not (study.placement.on_gpus or gpu):
        return []
    machine, where = forecast.prediction_machine(study, gpu)
    out = [f"predicted on {where}, before any request (servelab's performance model):"]
    for c in ids:
        out += forecast.prediction_lines(study, c, machine)
    return out


def run_study(study: Study, params_path: Path, *, only: list[str] | None = None, reduced: bool = False,
              force: bool = False, dry_run: bool = False, notebooks: bool = True, report: bool = True,
              resume: bool = False, stop_after_s: float | None = None) -> int:
    """Measure every (or `only` the named) configuration, then publish the report. Returns an exit status.
    Raises ParamsError, before anything starts, for what the engine, host or model would refuse
    (`preflight`; its warnings are printed), PlacementError for what the machine cannot hold (`placement`).
    `stop_after_s`: on GPUs, start no server after this many seconds (a started server measures its
    configurations); the page is published from what was measured, exit status 3, and --resume continues and
    publishes again. A configuration that failed: exit status 1, nothing published, its records kept."""
    t0 = time.monotonic()  # the study's time budget (design.budget_s) counts from here
    preflight(study.reduced_copy() if reduced else study, params_path, warn=log)
    if dry_run:
        print(describe(study, only))
        return 0
    if reduced:
        study = study.reduced_copy()
    configs = [c.id for c in study.configurations if not only or c.id in only]
    unknown = set(only or []) - {c.id for c in study.configurations}
    if unknown:
        raise ValueError(f"{params_path}: no configuration {sorted(unknown)}; have {[c.id for c in study.configurations]}")
    pub, root = reports_root() / study.study, runs_root() / study.study
    # --resume of runs on this machine: the published page is theirs (an earlier --stop-after) and is replaced;
    # without them (a page published elsewhere, a fresh clone) --resume measures everything and must not
    ours = resume and (root / STUDY_JSON).exists()
    if report and (pub / "index.html").exists() and not (force or ours):
        raise PublishedReportExists(f"{pub}/index.html is published: pass --force to replace it")
    if ours and all(done(study, root, c) for c in configs):  # measured on another machine
        log(f"every configuration of {study.study} is measured (--resume): nothing to start"
            + (", publishing" if report else ""))
        return _conclude(study, root, configs, [], [], publish_it=report, force=True)
    host = for_study(study)  # once per run: every configuration and the guard share it
    host.check()
    placed = (place(study, configs, params_path) if host.engine_here and not host.runs_remotely
              else placing.Placement([]))  # runs_remotely: the instance places the study itself
    plans = plan_study(study, host)
    todo = _to_measure(study, root, configs, force=force, resume=resume)
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / STUDY_JSON, {"format_version": FORMAT_VERSION, "params_path": str(params_path), "reduced": reduced,
                                   "study": json.loads(study.model_dump_json())})
    shutil.copy(params_path, root / "params.yaml")
    failed: list[str] = []
    left: list[str] = []  # not started before --stop-after
    try:
        with stop_signals(), host.guard():
            if host.runs_remotely:
                failed, left = _measure_there(host, study, params_path, root, todo, reduced=reduced,
                                              stop_after_s=stop_after_s, force=force)
            elif placed.cpu:
                failed = _measure(study, [plans[c] for c in todo], root, notebooks=notebooks, resume=resume, started=t0)
            else:
                failed, left = _measure_on_gpus(study, placed, root, notebooks=notebooks, resume=resume,
                                                deadline=t0 + stop_after_s if stop_after_s else None)
    finally:
        out = host.teardown()  # every path, also Ctrl-C and SIGTERM
        if out:
            log(out)
        scrub_tree(root)  # engine logs and anything else written by child processes
    print(format_table(_concat([RunFolder(root / c).summary for c in configs])))
    log(f"measured {len(todo) - len(failed) - len(left)} configuration(s) in {time.monotonic() - t0:.0f} s")
    return _conclude(study, root, configs, failed, left, publish_it=report, force=force or ours)


def _conclude(study: Study, root: Path, configs: list[str], failed: list[str], left: list[str], *,
              publish_it: bool, force: bool) -> int:
    """The run's exit status, the page published where it has one: 1 where a configuration failed (nothing
    published) or nothing was measured; 3 where --stop-after left configurations (published from the rest)."""
    if failed:
        log(f"failed: {failed}; records kept under {root}")
        return 1
    if left and not any(done(study, root, c) for c in configs):
        return 1  # nothing to publish
    if publish_it:
        publish(study.study, root, force=force)
    if left:
        log(f"published {len(configs) - len(left)} of {len(configs)} configurations; "
            f"not measured: {', '.join(left)} (--resume measures them and publishes again)")
        return 3
    return 0


def _to_measure(study: Study, root: Path, configs: list[str], *, force: bool, resume: bool) -> list[str]:
    """The configurations still to measure: with --resume those not done yet; else each one's run folder must
    not exist (runs are immutable) or goes with --force."""
    todo = []
    for cid in configs:
        rdir = root / cid
        if resume and done(study, root, cid):
            log(f"configuration {cid}: complete, skipped (--resume)")
            continue
        if rdir.exists() and not resume:
            if not force:
                raise RunFolderExists(f"{rdir} exists (runs are immutable): pass --force to measure again "
                                      "or --resume to continue an interrupted run")
            shutil.rmtree(rdir)
        todo.append(cid)
    return todo


def place(study: Study, ids: list[str], params_path: Path) -> placing.Placement:
    """Where the configurations `ids` run on this machine (`placement`): its GPUs, whose model directories are
    built first (offline) so that every server's memory is known, or its CPU. PlacementError, before any engine
    starts, for what the machine cannot hold."""
    machine = inventory()
    first = placing.plan(study, ids, machine, source=str(params_path))
    if first.cpu or all(s.memory_bytes is not None for s in first.servers()):
        return first
    dirs = {c: model_dir_for(study.engine_for(c)) for c in ids if study.engine_for(c).model is not None}
    return placing.plan(study, ids, machine, model_dirs=dirs, source=str(params_path))


def _measure_there(host: Any, study: Study, params_path: Path, root: Path, todo: list[str], *, reduced: bool,
                   stop_after_s: float | None, force: bool) -> tuple[list[str], list[str]]:
    """The study runner on the AWS instance (`host.aws.runner: instance`) for the configurations `todo`; its
    runs come back into `root`. Returns (failed, not started before --stop-after) as `_measure_on_gpus` does."""
    code = host.run_there(study.study, params_path, todo, reduced=reduced, stop_after_s=stop_after_s, force=force)
    missing = [c for c in todo if not done(study, root, c)]
    if code == 3:
        return [], missing
    if code:
        log(f"the instance's servelab run ended with exit status {code}")
    return missing, []


def _measure_on_gpus(study: Study, placed: placing.Placement, root: Path, *, notebooks: bool, resume: bool,
                     deadline: float | None) -> tuple[list[str], list[str]]:
    """Every configuration on the GPUs the placement gave its server (`lanes`); design.json says where each
    server ran and how long it took to start. Returns (the configurations that failed, those not started
    before the deadline)."""
    probe_host(study, placed, root, resume=resume)
    failed, left, startup = measure_placed(study, placed, root, notebooks=notebooks, resume=resume, deadline=deadline)
    write_design(root, DesignRecord(interleaved=False, reason="placed on the machine's GPUs, one server per engine",
                                    placement={**placed.record(), "startup_s": startup}))
    return failed, left


def probe_host(study: Study, placed: placing.Placement, root: Path, *, resume: bool) -> None:
    """The host probe (`measure.hostprobe`: this CPU's eager kernel launch, with the first engine's Python) into
    runs/<study>/host_probe.json before any server starts, so every configuration's prediction, stored before its
    first request, scales the engine's CPU-side terms by this host (`analysis.hosts`). A resumed run keeps the
    probe of its first start; a probe that cannot run is logged and the model takes the typical host."""
    out = root / HOST_PROBE_JSON
    if (resume and out.exists()) or not placed.servers():
        return
    result, why = hostprobe.probe(engine_python(placed.servers()[0].engine) or sys.executable)
    if result is None:
        log(f"{why}: predictions take the typical host of those seen")
        out.unlink(missing_ok=True)
        return
    write_json(out, result)
    log(f"host probe: one eager kernel launch takes {result['launch_eager_s'] * 1e6:.2f} us on this host")


def _concat(frames: list[Any]) -> Any:
    frames = [f for f in frames if f is not None and not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _measure(study: Study, todo: list[ConfigPlan], root: Path, *, notebooks: bool, resume: bool,
             started: float | None = None) -> list[str]:
    """Every configuration of `todo`: side by side and interleaved where they can be
    (`interleave_blocked` says why not), else one after another. Returns those that failed."""
    why = interleave_blocked(study, todo, resume)
    if why is None:
        return measure_interleaved(study, todo, root, notebooks=notebooks, started=started,
                                   fallback=lambda st, plans, r: _one_at_a_time(st, plans, r, notebooks=notebooks,
                                                                               resume=False))
    if len(todo) > 1:
        log(f"configurations measured one at a time: {why}")
    write_design(root, DesignRecord(interleaved=False, reason=why))
    return _one_at_a_time(study, todo, root, notebooks=notebooks, resume=resume)


def _one_at_a_time(study: Study, todo: list[ConfigPlan], root: Path, *, notebooks: bool, resume: bool) -> list[str]:
    failed: list[str] = []
    for plan in todo:
        cid = plan.config_id
        rdir = root / cid
        log(f"configuration {cid}: {'resume' if resume and rdir.exists() else 'start'}")
        effective = write_effective(study, rdir)
        try:
            run_config(plan, effective, rdir, notebooks=notebooks, reduced=False,
                       resume=resume and (rdir / RECORDS).exists())
        except (StageFailed, EngineError, RuntimeError) as e:
            log(str(e))
            failed.append(cid)
            break
    return failed


def publish(study_id: str, run_root: Path, *, force: bool = False, pub: Path | None = None) -> Path:
    """Copy raw runs into reports/<study>/data (or `pub`/data) and render the report from that copy."""
    pub = Path(pub) if pub is not None else reports_root() / study_id
    data = pub / "data"
    if data.exists():
        if not force and (pub / "index.html").exists():
            raise PublishedReportExists(f"{pub}/index.html is published: pass --force to replace it")
        shutil.rmtree(data)
    data.mkdir(parents=True)
    for f in ("params.yaml", STUDY_JSON, "tune.json", DESIGN_JSON):  # tune.json: a `tune:` study's search (servelab.tune)
        if (run_root / f).exists():
            shutil.copy(run_root / f, data / f)
    for failed in run_root.glob("*-failed"):  # logs of configurations that could not be measured
        shutil.copytree(failed, data / failed.name)
    if (run_root / "peer").is_dir():  # peer tools' results (vllm bench serve) measured beside the runs
        shutil.copytree(run_root / "peer", data / "peer")
    for cdir in sorted(p for p in run_root.iterdir()
                       if p.is_dir() and any((p / f).exists() for f in (RECORDS, *CHECK_FILES))):
        dst = data / cdir.name
        dst.mkdir()
        for f in (*PUBLISHED_FILES, *CHECK_FILES):
            if (cdir / f).exists():
                shutil.copy(cdir / f, dst / f)
        served_log = _server_log(run_root, cdir.name)
        if served_log is not None and not (dst / ENGINE_LOG).exists():
            shutil.copy(served_log, dst / ENGINE_LOG)
    scrub_tree(data)
    portable_tree(data)  # no path of this machine leaves it: relative paths and $SERVELAB_CACHE instead
    render(study_id, keep_dir=run_root, pub=pub)
    return pub / "index.html"


def _server_log(run_root: Path, config_id: str) -> Path | None:
    """The engine log of a configuration whose server ran outside its stages: the study runner's (shared by the
    configurations of one engine, `lanes`) or one `servelab serve` started."""
    handle = run_root / ".served" / f"{config_id}.json"
    server = read_json(handle).get("server") if handle.exists() else None
    for p in ((run_root / ".servers" / server / ENGINE_LOG) if server else None,
              run_root / ".served" / config_id / ENGINE_LOG):
        if p is not None and p.exists():
            return p
    return None


def render(study_id: str, keep_dir: Path | None = None, *, index: bool = True, parallel: bool = True,
           pub: Path | None = None) -> Path:
    """Execute the write-up on reports/<study>/data (or `pub`/data) and write index.html (inputs hidden),
    plus index.<lang>.html for each of the study's `translations`, linked to each other; then
    reports/index.html (unless `index` is false: `render_reports` writes it once; or the study is
    published outside reports/).

    The executed notebooks are kept in `keep_dir` when given (nbval checks them), else discarded.
    """
    pub = Path(pub) if pub is not None else reports_root() / study_id
    index = index and pub.resolve().parent == reports_root().resolve()
    if not (pub / "data").exists():
        raise FileNotFoundError(f"{pub / 'data'} does not exist: nothing to render")
    t0 = time.monotonic()
    sj = read_json(pub / "data" / STUDY_JSON)
    study = study_from_dict(upgrade(sj["study"], sj.get("format_version")), str(pub / "data" / STUDY_JSON))
    langs = [study.language, *[x for x in study.translations if x != study.language]]
    pages = {lang: "index.html" if i == 0 else f"index.{lang}.html" for i, lang in enumerate(langs)}
    write_study_verdicts(load_study_data(pub))  # data/verdicts.json: what the write-up's verdicts read
    with tempfile.TemporaryDirectory(prefix="servelab-render-") as tmp:
        work = Path(keep_dir) if keep_dir else Path(tmp)
        jobs = []
        for lang, page in pages.items():
            other = next((x for x in langs if x != lang), None) if lang == langs[0] else langs[0]
            alternate = {"href": pages[other], "label": words(lang)("page.other_language")} if other else None
            jobs.append((WRITEUP if page == "index.html" else f"{WRITEUP}.{lang}", lang, page, alternate))

        def one(name: str, lang: str, page: str, alternate: dict[str, str] | None) -> None:
            nb = execute_notebook(WRITEUP, work, {"study_dir": str(pub.resolve()), "language": lang}, out_name=name,
                                  save_each_cell=False)
            notebook_to_html(nb, pub / page, title=study.in_language(lang).title, language=lang, alternate=alternate,
                             scrub=lambda text: portable(scrub(text)))

        if parallel and len(jobs) > 1:  # a language per core: a write-up is one busy core
            with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
                for f in [pool.submit(one, *j) for j in jobs]:
                    f.result()
        else:
            for j in jobs:
                one(*j)
    if index:
        write_index(reports_root())
    log(f"report {pub / 'index.html'} rendered in {time.monotonic() - t0:.1f} s"
         + (f" (+ {', '.join(list(pages.values())[1:])})" if len(pages) > 1 else ""))
    return pub / "index.html"


def render_reports(study_id: str | None) -> int:
    root = reports_root()
    ids = [study_id] if study_id else sorted(p.name for p in root.iterdir() if (p / "data").is_dir())
    if not ids:
        log(f"no published study under {root}")
        return 1
    if len(ids) == 1:
        render(ids[0])
        return 0
    # each study renders in its own process (a write-up is one busy core: pandas, matplotlib),
    # as many at once as there are cores; reports/index.html is written once, after all of them
    with ProcessPoolExecutor(min(len(ids), os.cpu_count() or 1)) as pool:
        for f in [pool.submit(render, s, index=False, parallel=False) for s in ids]:
            f.result()
    write_index(root)
    return 0
