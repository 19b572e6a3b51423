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

import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .engines.smoke import smoke_check
from .hosts.attach import serve, stop_served
from .hosts.process import RssWatcher
from .measure.runinfo import base_record, engine_gpu_devices, layout_record, model_record
from .measure.runner import RunResult, run_workload
from .models import model_facts
from .plan import ConfigPlan
from .runfolder import (ENGINE_JSON, HOST_JSON, PREDICTION_JSON, QUALITY_JSON, RunFolder, read_engine, read_json, runs_root,
                        write_design, write_engine, write_json)
from .measure.grid import levels
from .schema.runfiles import Design


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
    if host.engine_on_this_machine(h) and not rec["client_host"].get("gpus"):
        # the engine runs on this CPU: measure its memory bandwidth and matmul rate for the roofline
        from .measure.probe import measure_cpu_bandwidth

        rec["hardware_measured"] = hardware or measure_cpu_bandwidth(seconds=1.0)
    if not (resume and (Path(rdir) / PREDICTION_JSON).exists()):
        write_json(Path(rdir) / PREDICTION_JSON, _prediction(study, config_id, rec, host.server(config_id, h)))
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
        from .measure.capacity import run_capacity_study

        return run_capacity_study(server, plan.workload, rdir, cap, study.slo, **kw)
    return run_workload(server, plan.workload, rdir, **kw)


def benchmark_interleaved(plans: list[ConfigPlan], rdirs: list[Path], *, deadline_unix: float | None = None,
                          log: Callable[[str], None] | None = None) -> Design:
    """Every configuration's workload against its own engine, all running side by side, one round
    at a time in alternating order, with sequential sampling until each change's verdict is
    settled or the study's time budget (`deadline_unix`, time.time() seconds) is spent
    (`measure.interleave`, `analysis.verdicts`). Writes design.json beside the run folders;
    returns it."""
    import time as _time

    from .measure.interleave import Start, run_interleaved
    from .measure.probe import measure_cpu_bandwidth
    from .runfolder import now_iso

    study, design = plans[0].study, plans[0].study.design
    starts, hw = [], None
    for plan, rdir in zip(plans, rdirs):
        h = read_engine(Path(rdir) / ENGINE_JSON)
        if hw is None and plan.host.engine_on_this_machine(h):
            hw = measure_cpu_bandwidth(seconds=1.0)  # one machine: probed once for every configuration
        rec, rss, _ = _run_record(plan, h, Path(rdir), hw)
        starts.append(Start(plan.config_id, plan.host.server(plan.config_id, h), Path(rdir), rec, h.get("pid"),
                            _add_rss(rss)))
    deadline = (_time.monotonic() + max(0.0, deadline_unix - _time.time())) if deadline_unix else None
    decide = sampling_rule(plans) if deadline is not None else None  # no budget: the workload's rounds
    t0, began = _time.monotonic(), now_iso()
    results, sampling = run_interleaved(starts, plans[0].workload, study=study.study, decide=decide,
                                        deadline=deadline, max_rounds=design.max_rounds, log=log)
    out = Design(interleaved=True, order=[p.config_id for p in plans], started_at=began,
                 benchmark_s=_time.monotonic() - t0, budget_s=design.budget_s, mde_target=design.mde_target_pct / 100.0,
                 max_rounds=design.max_rounds, first_rounds=plans[0].workload.rounds,
                 left_s=(deadline - _time.monotonic()) if deadline else None, levels=sampling,
                 status={cid: r.status for cid, r in results.items()})
    return write_design(Path(rdirs[0]).parent, out, update=True)


def sampling_rule(plans: list[ConfigPlan]) -> Callable[[int, pd.DataFrame], tuple[set[str], str]]:
    """The study's sampling rule (`analysis.verdicts.sampling_rule`) for these configurations: their
    comparisons under the one baseline rule, on the levels each plans to measure."""
    from .analysis import verdicts as v

    study = plans[0].study
    ids = [p.config_id for p in plans]
    groups = v.setting_groups({p.config_id: p.engine.model_dump() for p in plans})
    planned = {p.config_id: {(lv.bucket.label, lv.concurrency) for lv in levels(p.workload)} for p in plans}
    base = v.baselines(ids, {c: study.config(c).baseline for c in ids}, study.same_model, planned)
    return v.sampling_rule(v.comparisons(base, groups), groups, target=study.design.mde_target_pct / 100.0,
                           given_sd_pct=study.design.between_starts_sd_pct)


def _prediction(study: Any, config_id: str, rec: dict[str, Any], server: Any = None) -> dict[str, Any]:
    """What the performance model predicts (`analysis.perfmodel`: the model facts, the engine's flags
    and the machine's calibration), to be stored in prediction.json before the first request so it
    can never be fitted to the result it is compared with; what is missing says "not predictable"
    with the fact. Never raises: a prediction is a record, not a reason to stop a measurement."""
    from .analysis.perfmodel import predict_configuration
    from .runfolder import now_iso

    wl = study.workload_for(config_id)
    try:
        return predict_configuration(rec, wl, study.slo.model_dump(), bucket_lengths(wl, server), now_iso("microseconds"))
    except Exception as e:  # noqa: BLE001 - said so in the file instead
        return {"stored_at": now_iso(), "stored_before_measurement": True,
                "not_predictable": f"the model failed: {type(e).__name__}: {e}"}


def prediction_machine(study: Any, hardware: str | None) -> tuple[dict[str, Any], str]:
    """A run record's machine fields for a prediction before anything runs (`servelab predict`, the dry run):
    the GPU named (or the study's: a device study or a remote host, the newest calibrated GPU), else this CPU."""
    from .analysis.calibration import calibration_for, calibrations
    from .errors import UserError
    from .hosts import get as host_class

    name = hardware
    if name is None and (study.device is not None or not host_class(study.host.kind).engine_here):
        gpus = [c for c in calibrations() if c["machine"]["kind"] == "gpu"]
        if not gpus:
            raise UserError("no GPU calibration entry (data/calibrations/): give --hardware or run calibrate-hw")
        name = gpus[-1]["machine"]["name"]
    if name and name.lower() != "cpu":
        entry, own = calibration_for("gpu", name)
        mem = (entry or {}).get("machine", {}).get("memory_bytes") if own else None
        return {"gpus_used": [{"name": name, "memory": f"{mem / 2**20:.0f} MiB" if mem else ""}]}, name
    from .measure.probe import measure_cpu_bandwidth

    probe = measure_cpu_bandwidth(seconds=1.0)
    return {"hardware_measured": probe}, f"this CPU ({probe.get('cpu_model')}, {probe.get('cpu_count')} cores)"


def prediction_lines(study: Any, config_id: str, machine: dict[str, Any]) -> list[str]:
    """A configuration's prediction in words (`servelab predict`, the dry run): the calibration it used, per
    bucket TPOT at every concurrency with its kind (estimate or bound), TTFT, prefill, the KV-limited
    concurrency and the capacity, and why a bound is one. Builds the model directory (offline) for its facts."""
    from types import SimpleNamespace

    from .analysis.perfmodel import predict_configuration
    from .hosts.local import model_dir_for
    from .runfolder import now_iso

    eng, wl = study.engine_for(config_id), study.workload_for(config_id)
    mdir = model_dir_for(eng)
    rec = {"study": study.study, "config": config_id, "engine_params": eng.model_dump(), **machine,
           "model": {"facts": model_facts(mdir)}}
    server = SimpleNamespace(base_url="http://127.0.0.1:9", model=mdir, headers={}, tokenizer_dir=mdir)
    pred = predict_configuration(rec, wl, study.slo.model_dump(), bucket_lengths(wl, server), now_iso())
    if pred.get("not_predictable"):
        return [f"{config_id}: not predictable: {pred['not_predictable']}"]
    mach = pred.get("machine") or {}
    out = [f"{config_id}: " + (f"calibration {mach['calibration']} ({mach['name']}, measured "
                               f"{str(mach['measured_at'])[:10]})" if mach.get("calibration")
                               else f"roofline bounds ({mach.get('why')})")]
    for label, p in pred["buckets"].items():
        kinds = p.get("kinds") or {}
        tp = ", ".join(f"c={c} {fmt_value(v, 1000, ' ms')}" for c, v in sorted(p["tpot_s"].items(), key=lambda x: int(x[0])))
        out.append(f"  {label}: TPOT {tp} ({kinds.get('tpot_s')}); TTFT c=1 {fmt_value(p['ttft_c1_s'], 1000, ' ms')}; "
                   f"prefill {fmt_value(p['prefill_tok_s'])} tok/s; KV-limited concurrency "
                   f"{fmt_value(p['kv_limited_concurrency'])}; capacity at SLO {fmt_value(p.get('capacity_rps'))} req/s "
                   f"(c={p.get('capacity_concurrency')}, {p.get('capacity_binding')})")
        out += [f"    bound: {why}" for why in p.get("bound_because") or []]
    return out


def fmt_value(v: Any, scale: float = 1.0, unit: str = "") -> str:
    """A predicted figure for a terminal: 3 significant digits (thousands whole), "-" when unknown."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    x = float(v) * scale
    return f"{x:,.3g}{unit}" if abs(x) < 1000 else f"{x:,.0f}{unit}"


def bucket_lengths(wl: Any, server: Any = None) -> dict[str, tuple[int | None, int | None]]:
    """Each bucket's (input, output) tokens for a prediction: as set, or for a prompt set the
    median of its prompts counted by the server's tokenizer (no request is sent); None where
    neither is known (a trace, a session, no server to count with)."""
    import statistics

    from .measure.workload import token_counter
    from .prompts import load_set

    out: dict[str, tuple[int | None, int | None]] = {}
    counter = None
    for b in wl.buckets:
        n_in = b.input_tokens
        if n_in is None and b.prompt_set and server is not None:
            try:
                counter = counter or token_counter(server.base_url, server.model, wl.api, server.headers,
                                                   server.tokenizer_dir, wl.chat_template_kwargs, warn=lambda m: None)
                n_in = int(statistics.median(counter.count(p.raw()) for p in load_set(b.prompt_set).prompts))
            except (OSError, ValueError, KeyError):  # no tokenizer to count with: not predictable, said so
                n_in = None
        out[b.label] = (n_in, b.output_tokens)
    return out


def quality(plan: ConfigPlan, rdir: Path) -> dict[str, Any] | None:
    """The output check after the benchmark (`measure.quality`): quality.json in the run folder;
    None when the study turns it off. With dummy weights it records that it is not measurable."""
    from .measure.quality import DUMMY_REASON, run_quality

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


def against_reference(q: dict[str, Any], rdir: Path, qp: Any, model_dir: Path | None = None) -> dict[str, Any]:
    """The configuration's answers held against the model's own (`models.reference`: transformers,
    float32, greedy), with where and how those were made; {"available": False, "reason"} when the
    model directory is not on this machine (`model_dir` names it for a published run folder) or the
    reference could not be made."""
    from .analysis.quality import compare
    from .measure.quality import selected_prompts
    from .models.reference import cpu_name, reference_answers

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

def quality_line(q: dict[str, Any] | None) -> str:
    """The quality check's result in one line (quality.json as `quality` returned it)."""
    if q is None:
        return "quality check: off"
    if not q["measurable"]:
        return f"quality check: not measurable ({q['reason']})"
    return f"quality check: {q['score']['correct']}/{q['score']['total']} known answers"


def launch_plan(plan: ConfigPlan, python: str | None = None) -> str:
    """What `launch` will start or reach for this configuration (the dry-run lines): the engine
    command with its derived values, shell-quoted, in the host's words."""
    return "\n".join(plan.launch_lines(python))


def level_plan(plan: ConfigPlan) -> pd.DataFrame:
    """The load levels `benchmark` will send: bucket, concurrency (or rate), rounds, requests."""
    from .measure.runner import levels, requests_per_round

    wl = plan.workload
    rows = [{"bucket": lv.bucket.label, "load": lv.label.split(" ", 1)[1], "warmup rounds": wl.warmup_rounds,
             "measured rounds": wl.rounds, "requests per round": requests_per_round(wl, lv)} for lv in levels(wl)]
    return pd.DataFrame(rows)


def model_facts_table(host: dict[str, Any]) -> pd.DataFrame:
    """Architecture facts of the provisioned model as a two-column table (the URL for attach)."""
    if not host.get("model_dir"):
        return pd.DataFrame({"fact": ["url"], "value": [host.get("url")]})
    f = model_facts(Path(host["model_dir"]))
    return pd.DataFrame({"fact": list(f), "value": [str(v) for v in f.values()]})


def launch_table(handle: dict[str, Any]) -> pd.DataFrame:
    import shlex

    info = handle.get("info", {})
    rows = {"mode": handle.get("mode"), "base_url": handle.get("base_url"), "model": handle.get("model"),
            "version": info.get("version"),
            "startup_s": f"{info['startup_s']:.1f}" if info.get("startup_s") else None,
            "command": shlex.join(info.get("command") or [])}
    return pd.DataFrame({"": list(rows), "value": list(rows.values())})


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The per-level summary with readable units (ms, tok/s, %)."""
    if summary is None or summary.empty:
        return summary
    t = summary[["bucket", "concurrency", "sent", "ok", "prompt_tokens", "output_tokens_p50", "ttft_p50_s",
                 "ttft_p95_s", "decode_tps_p50", "e2e_output_tps_p50", "aggregate_output_tps",
                 "aggregate_output_tps_min", "aggregate_output_tps_max", "failures"]].copy()
    for c in ("ttft_p50_s", "ttft_p95_s"):
        t[c] = t[c] * 1000
    t = t.rename(columns={"ttft_p50_s": "TTFT p50 ms", "ttft_p95_s": "TTFT p95 ms", "decode_tps_p50": "decode tok/s",
                          "e2e_output_tps_p50": "E2E tok/s", "aggregate_output_tps": "aggregate tok/s",
                          "aggregate_output_tps_min": "agg min", "aggregate_output_tps_max": "agg max",
                          "output_tokens_p50": "output tokens", "prompt_tokens": "prompt tokens"})
    return t.round(1)


def sampling_table(design: Design) -> pd.DataFrame:
    """Per level of an interleaved benchmark: measured rounds per configuration, why its sampling
    stopped, its seconds (of them the warm-up's), the disturbed rounds and those measured again
    (design.json's `levels`)."""
    rows = [{"level": x.label, **{f"rounds {k}": n for k, n in x.rounds.items()}, "stopped": x.stopped,
             "seconds": round(x.seconds, 1), "warm-up s": round(x.warmup_s, 1), "disturbed": x.disturbed,
             "measured again": x.remeasured, "last note": x.note} for x in design.levels]
    return pd.DataFrame(rows)


def server_metrics_table(run: RunFolder) -> pd.DataFrame:
    """Per level: peak KV usage, running, waiting and the preemptions counted during it."""
    s = run.samples
    if s is None or s.empty or "level" not in s:
        reason = getattr(s, "attrs", {}).get("reason") if s is not None else "no server_metrics.jsonl"
        return pd.DataFrame({"server metrics": [f"not available ({reason})"]})
    g = s.dropna(subset=["level"]).groupby("level", sort=False)
    out = pd.DataFrame({
        "samples": g.size(),
        "KV usage max %": g["kv_usage_frac"].max() * 100,
        "running max": g["running"].max(),
        "waiting max": g["waiting"].max(),
        "preemptions": g["preemptions_total"].max() - g["preemptions_total"].min(),
    })
    return out.round(1)


__all__ = ["provision", "launch", "benchmark", "smoke", "run_dir", "launch_plan", "level_plan", "serve", "stop_served",
           "HOST_JSON"]
