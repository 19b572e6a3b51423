"""The pipeline stages of one configuration, as plain functions the stage notebooks call.

provision -> launch -> benchmark each take the configuration's `plan.ConfigPlan` (its resolved
engine, workload and the study's host, decided once) and read and write files in the run
folder `runs/<study>/<config>/`, so every stage can run in its own process (papermill executes
one notebook per stage, each rebuilding its plan from the run folder): `launch` leaves the
engine running and writes `engine.json`; `benchmark` reads it; the pipeline stops the engine
from that handle (`Host.stop`). What differs between a local process, an attached server and
an AWS host is the plan's `Host` (`servelab.hosts`). Not for diagnosis or the write-up
(`analysis`, `report`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .analysis import verdicts
from .analysis.quality import compare
from .engines.smoke import smoke_check
from .forecast import prediction
from .hosts.attach import serve, stop_served
from .hosts.process import RssWatcher
from .measure.capacity import run_capacity_study
from .measure.interleave import Decide, Start, run_interleaved
from .measure.probe import measure_cpu_bandwidth
from .measure.quality import DUMMY_REASON, run_quality, selected_prompts
from .measure.runinfo import base_record, engine_gpu_devices, layout_record, model_record
from .measure.runner import RunResult, levels, run_workload
from .models.reference import cpu_name, reference_answers
from .plan import ConfigPlan
from .runfolder import (ENGINE_JSON, HOST_JSON, HOST_PROBE_JSON, PREDICTION_JSON, QUALITY_JSON, now_iso, read_engine, read_json,
                        runs_root, write_design, write_engine, write_json)
from .schema.runfiles import DesignRecord


def run_dir(study: str, config_id: str, root: Path | None = None) -> Path:
    return Path(root or runs_root()) / study / config_id


def provision(plan: ConfigPlan, rdir: Path) -> dict[str, Any]:
    """Prepare the host for one configuration (local: build the model directory offline)."""
    return plan.host.provision(plan.config_id, Path(rdir), plan.engine)


def launch(plan: ConfigPlan, rdir: Path) -> dict[str, Any]:
    """Start the engine (local), reach it (attach, AWS); run the smoke check; writes engine.json."""
    handle = plan.host.launch(plan.config_id, Path(rdir), plan.engine)
    handle["info"]["smoke_check"] = smoke(plan, handle)
    write_engine(Path(rdir) / ENGINE_JSON, handle)
    return handle


def smoke(plan: ConfigPlan, handle: dict[str, Any]) -> dict[str, Any]:
    """The post-launch functional check: a chat reply and, with a tool-call parser, a tool call.
    With dummy weights the answers are recorded but the check does not apply."""
    host, eng = plan.host, plan.study.engine_for(plan.config_id)
    try:
        return smoke_check(handle["base_url"], handle["model"], host.client_headers(plan.config_id, handle),
                           tool_call=bool(eng.args.get("tool-call-parser")),
                           dummy_weights=host.weights_known(handle) and eng.load_format == "dummy", max_tokens=16)
    except Exception as e:  # the check is a record, never a reason to stop the measurement
        return {"applies": None, "ok": False, "reason": f"smoke check failed: {type(e).__name__}: {e}"}


def _run_record(plan: ConfigPlan, h: dict[str, Any], rdir: Path, hardware: dict[str, Any] | None = None,
                resume: bool = False) -> tuple[dict[str, Any], RssWatcher | None, list[dict[str, Any]] | None]:
    """run.json's opening record of one configuration (what ran, the machine), the engine's RSS
    watcher (started) and the GPUs it uses; the prediction is written to prediction.json in `rdir`
    now, before the first request (a resumed run keeps the one stored before its first start).
    `hardware`: the CPU probe's result when the caller measured it already."""
    host, study, config_id = plan.host, plan.study, plan.config_id
    rss = RssWatcher(h["pid"]) if h.get("pid") else None
    if rss:
        rss.start()
    eng = plan.engine  # what launched: derived values (auto) filled in
    rec = base_record(study.study, config_id)
    rec["configuration"] = plan.config.model_dump()
    rec["engine_params"] = eng.model_dump()
    rec["layout"] = layout_record(plan.profile, eng, (h.get("info") or {}).get("env"))
    rec["model"] = model_record(h.get("tokenizer_dir"), eng.load_format)
    gpus = engine_gpu_devices(eng.env)
    if gpus is not None:
        rec["gpus_used"] = gpus
    if (Path(rdir).parent / HOST_PROBE_JSON).is_file():  # the GPU host's CPU, probed by the runner (pipeline.probe_host)
        rec["host_probe"] = read_json(Path(rdir).parent / HOST_PROBE_JSON)
    if host.engine_on_this_machine(h) and not rec["client_host"].get("gpus"):
        # the engine runs on this CPU: measure its memory bandwidth and matmul rate for the roofline
        rec["hardware_measured"] = hardware or measure_cpu_bandwidth(seconds=1.0)
    if not (resume and (Path(rdir) / PREDICTION_JSON).exists()):
        write_json(Path(rdir) / PREDICTION_JSON, prediction(study, config_id, rec, host.server(config_id, h)))
    rec["prediction_file"] = PREDICTION_JSON
    return rec, rss, gpus


def _add_rss(rss: RssWatcher | None) -> Callable[[dict[str, Any]], None]:
    def add(record: dict[str, Any]) -> None:
        if rss:
            rss.stop()
            info = record.setdefault("server", {})
            info["peak_rss_bytes"] = max(rss.peak_bytes, info.get("peak_rss_bytes") or 0)
    return add


def benchmark(plan: ConfigPlan, rdir: Path, *, progress: bool = True,
              log: Callable[[str], None] | None = None, resume: bool = False) -> RunResult:
    """Run the configuration's workload against its server; returns RunResult."""
    rdir = Path(rdir)
    host, study, config_id = plan.host, plan.study, plan.config_id
    h = read_engine(rdir / ENGINE_JSON)
    server = host.server(config_id, h)
    rec, rss, gpus = _run_record(plan, h, rdir, resume=resume)
    kw = dict(study=study.study, config_id=config_id, record=rec, progress=progress, log=log, resume=resume,
              gpu_devices=[g["index"] for g in gpus] if gpus else None, before_final=_add_rss(rss))
    cap = study.capacity_for(config_id)
    if cap is not None:  # the search chooses the levels; each trial is an ordinary level
        return run_capacity_study(server, plan.workload, rdir, cap, study.slo, **kw)
    return run_workload(server, plan.workload, rdir, **kw)


def benchmark_interleaved(plans: list[ConfigPlan], rdirs: list[Path], *, deadline_unix: float | None = None,
                          quality_s: float | None = None, log: Callable[[str], None] | None = None) -> DesignRecord:
    """Every configuration's workload against its own engine, all running side by side, one round
    at a time in alternating order, with sequential sampling until each change's verdict is
    settled or the study's time budget (`deadline_unix`, time.time() seconds) is spent
    (`measure.interleave`, `analysis.verdicts`). Writes design.json beside the run folders;
    returns it, with `quality_s` (the quality checks' wall time before it) recorded."""
    study, design = plans[0].study, plans[0].study.design
    starts, hw = [], None
    for plan, rdir in zip(plans, rdirs):
        h = read_engine(Path(rdir) / ENGINE_JSON)
        if hw is None and plan.host.engine_on_this_machine(h):
            hw = measure_cpu_bandwidth(seconds=1.0)  # one machine: probed once for every configuration
        rec, rss, _ = _run_record(plan, h, Path(rdir), hw)
        starts.append(Start(plan.config_id, plan.host.server(plan.config_id, h), Path(rdir), rec, h.get("pid"),
                            _add_rss(rss)))
    deadline = (time.monotonic() + max(0.0, deadline_unix - time.time())) if deadline_unix else None
    decide = sampling_rule(plans) if deadline is not None else None  # no budget: the workload's rounds
    t0, began = time.monotonic(), now_iso()
    results, sampling = run_interleaved(starts, plans[0].workload, study=study.study, decide=decide,
                                        deadline=deadline, max_rounds=design.max_rounds, log=log)
    out = DesignRecord(interleaved=True, order=[p.config_id for p in plans], started_at=began,
                 benchmark_s=time.monotonic() - t0, quality_s=quality_s,
                 sampling_rule="mde-borrow-then-budget" if decide is not None else None, budget_s=design.budget_s, mde_target=design.mde_target_pct / 100.0,
                 max_rounds=design.max_rounds, first_rounds=plans[0].workload.rounds,
                 left_s=(deadline + sum(x.credited_s for x in sampling) - time.monotonic()) if deadline else None,
                 levels=sampling,
                 status={cid: r.status for cid, r in results.items()})
    return write_design(Path(rdirs[0]).parent, out, update=True)


def sampling_rule(plans: list[ConfigPlan]) -> Decide:
    """The study's sampling rule (`analysis.verdicts.sampling_rule`) for these configurations: their
    comparisons under the one baseline rule, on the levels each plans to measure."""
    study = plans[0].study
    ids = [p.config_id for p in plans]
    groups = verdicts.setting_groups({p.config_id: p.engine.model_dump() for p in plans})
    planned = {p.config_id: {(lv.bucket.label, lv.concurrency) for lv in levels(p.workload)} for p in plans}
    base = verdicts.baselines(ids, {c: study.config(c).baseline for c in ids}, study.same_model, planned)
    return verdicts.sampling_rule(verdicts.comparisons(base, groups), groups, target=study.design.mde_target_pct / 100.0,
                           given_sd_pct=study.design.between_starts_sd_pct)


def quality(plan: ConfigPlan, rdir: Path) -> dict[str, Any] | None:
    """The output check after the benchmark (`measure.quality`): quality.json in the run folder;
    None when the study turns it off. With dummy weights it records that it is not measurable."""
    qp, rdir = plan.study.quality, Path(rdir)
    if qp.enabled is False:
        return None
    host = plan.host
    h = read_engine(rdir / ENGINE_JSON)
    server = host.server(plan.config_id, h)
    dummy = host.weights_known(h) and plan.engine.load_format == "dummy"
    kw = dict(sets=qp.sets, prompts_per_set=qp.prompts_per_set, max_tokens=qp.max_tokens, headers=server.headers)
    try:
        q = run_quality(server.base_url, server.model, measurable=not dummy,
                        reason=DUMMY_REASON if dummy else None, out_dir=rdir, **kw)
    except Exception as e:  # the check is a record, never a reason to lose the measured run
        return run_quality(server.base_url, server.model, measurable=False, out_dir=rdir,
                           reason=f"the quality check failed: {type(e).__name__}: {str(e)[:200]}", **kw)
    if qp.reference and q["measurable"]:
        q["reference"] = against_reference(q, rdir, qp)
        write_json(rdir / QUALITY_JSON, q)
    return q


def quality_all(plans: list[ConfigPlan], rdirs: list[Path], *, lanes: int = 2) -> tuple[dict[str, Any], float]:
    """`quality` of every configuration before an interleaved benchmark, `lanes` engines at a time
    (greedy answers do not depend on a neighbour; with one torch thread an engine leaves the other
    core free); ({config: its quality.json}, wall seconds of the whole check)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, min(lanes, len(plans)))) as pool:
        done = list(pool.map(quality, plans, [Path(r) for r in rdirs]))
    return {p.config_id: q for p, q in zip(plans, done)}, time.monotonic() - t0


def against_reference(q: dict[str, Any], rdir: Path, qp: Any, model_dir: Path | None = None) -> dict[str, Any]:
    """The configuration's answers held against the model's own (`models.reference`: transformers,
    float32, greedy), with where and how those were made; {"available": False, "reason"} when the
    model directory is not on this machine (`model_dir` names it for a published run folder) or the
    reference could not be made."""
    if model_dir is None:
        model_dir = read_json(rdir / HOST_JSON).get("model_dir") if (rdir / HOST_JSON).exists() else None
    if not model_dir or not Path(model_dir).is_dir():
        return {"available": False, "reason": "the model directory is not on this machine"}
    chosen = selected_prompts(qp.sets, qp.prompts_per_set)
    try:
        ref = reference_answers(Path(model_dir), [(f"{s}/{p.id}", p.chat()) for s, p in chosen], qp.max_tokens)
    except Exception as e:  # a record, never a reason to lose the check
        return {"available": False, "reason": f"the reference failed: {type(e).__name__}: {str(e)[:200]}"}
    as_q = {"measurable": True, "prompts": [{"id": p.id, "set": s, **ref["answers"][f"{s}/{p.id}"]} for s, p in chosen]}
    c = compare(q, as_q)
    return {"available": True, "identical": c["identical"], "total": c["total"],
            "first_divergence": c["first_divergence"], "this_machine": cpu_name(),
            **{k: ref[k] for k in ("implementation", "dtype", "decoding", "max_tokens", "computed_on", "computed_at")}}


# -- views the stage notebooks show ------------------------------------------------------------

__all__ = ["HOST_JSON", "benchmark", "benchmark_interleaved", "launch", "provision", "quality", "quality_all", "run_dir",
           "sampling_rule", "serve", "smoke", "stop_served"]
