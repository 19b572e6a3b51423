"""`servelab calibrate-hw --ttft-from / --moe-prefill-from / --mla-prefill-from / --hosts-from`: terms of the
performance model fitted on published studies (their TTFTs and TPOTs at one request in flight) rather than measured by
the calibration sweep (`calibrate_hw`), each stored in a calibration entry with its points, studies and dates.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

import yaml

from . import yamlio
from .analysis import perfmodel
from .analysis import perfmodel_terms as terms
from .analysis.calibration import Machine
from .engines import get as engine_profile
from .engines.flags import engine_args
from .errors import UserError
from .log import progress_line
from .report import load_study_data
from .tables import CALIBRATIONS


def _entry(add_to: str, flag: str) -> tuple[Path, dict[str, Any]]:
    """The calibration entry a fit goes into: its file and its contents (a UserError naming `flag` when none)."""
    target = CALIBRATIONS / f"{add_to}.yaml"
    if not target.is_file():
        raise UserError(f"calibrate-hw {flag}: no calibration entry {target}")
    return target, yamlio.safe_load(target.read_text())


def _store_term(entry: dict[str, Any], engine: str, term: str, target: Path, record: dict[str, Any]) -> None:
    """A fitted term into the calibration entry's `engines.<engine>` and the entry back to its file."""
    entry.setdefault("engines", {}).setdefault(engine, {})[term] = record
    target.write_text(yaml.safe_dump(entry, sort_keys=False, width=120), encoding="utf-8")


def moe_prefill_from(study_dir: Path | str, add_to: str, engine: str = "vllm") -> dict[str, Any]:
    """The engine's MoE prefill term (`perfmodel_terms.fit_moe_prefill`) from a published TTFT sweep
    (a study whose configurations send prompts of several lengths at concurrency 1, MoE shapes and a
    dense one; params/h200-arch-holdout.yaml), stored in calibration entry `add_to` as
    `engines.<engine>.moe_prefill` with its points, study and date. Each MoE length's residual (the
    measured TTFT less the model's prefill without the term) less the dense shape's residual at the
    same bucket is what the MoE layers cost beyond the model; fitted per MoE layer against tokens."""

    target, entry = _entry(add_to, "--moe-prefill-from")
    base = copy.deepcopy(entry)
    (base.get("engines") or {}).get(engine, {}).pop("moe_prefill", None)
    m = Machine(base)
    sd = load_study_data(Path(study_dir))
    s = sd.summary
    resid: dict[str, dict[str, tuple[float, float]]] = {}
    moe_cfgs, dense_cfgs = [], []
    for cid in sd.config_ids:
        g = s[(s["config"] == cid) & (s["concurrency"] == 1)]
        facts = ((sd.runs[cid].get("model") or {}).get("facts")) or {}
        if g["bucket"].nunique() < 2 or not facts.get("param_count"):
            continue
        mode = perfmodel.mode_of(engine, engine_args((sd.runs[cid].get("engine_params") or {}).get("args")))
        resid[cid] = {r.bucket: (float(r.prompt_tokens), float(r.ttft_p50_s) - perfmodel.prefill_time(
            m, engine, mode, facts, float(r.prompt_tokens))) for r in g.itertuples()}
        (moe_cfgs if facts.get("num_experts") else dense_cfgs).append(cid)
    if not moe_cfgs or not dense_cfgs:
        raise UserError(f"{study_dir}: a MoE prefill fit needs TTFT sweeps (two prompt lengths or more at c=1) of a "
                        f"MoE shape and a dense one; found MoE {moe_cfgs}, dense {dense_cfgs}")
    dense = dense_cfgs[0]
    pts = [{"config": cid, "bucket": b, "tokens": n, "moe_layers": int(sd.runs[cid]["model"]["facts"]["num_moe_layers"]),
            "residual_s": r - resid[dense][b][1]}
           for cid in moe_cfgs for b, (n, r) in resid[cid].items() if b in resid[dense]]
    fitted = terms.fit_moe_prefill(pts)
    started = min(str(sd.runs[c].get("started_at", ""))[:10] for c in moe_cfgs + [dense])
    _store_term(entry, engine, "moe_prefill", target, {
        **fitted, "points": pts, "measured_at": started,
        "source": f"{Path(study_dir).name}: TTFT at c=1 of {', '.join(moe_cfgs)} less the model's prefill, less "
                  f"the same residual of the dense {dense} (calibrate-hw --moe-prefill-from)"})
    progress_line(f"calibrate-hw: MoE prefill {fitted['layer_s'] * 1e6:.1f} us + {fitted['token_layer_s'] * 1e9:.2f} "
                  f"ns x tokens per MoE layer (r2 {fitted['r2']:.3f}, {fitted['n']} points) into {target}")
    return entry


def mla_layers(facts: dict[str, Any]) -> int:
    """The model's latent-attention layers (0 for any other attention)."""
    counts = perfmodel.layer_counts(facts) if facts.get("num_layers") else {}
    return counts.get("mla", 0) + counts.get("mla_dense", 0)


def request_points(study_dirs: list[Path | str], entry: dict[str, Any], engine: str = "vllm",
                   launch_wait: float | None = None, loaded: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every concurrency-1 level of the studies' configurations that ran `engine` with CUDA graphs on one GPU
    of the entry's kind (no speculative decoding): its median TTFT and the model's prefill steps for its prompt
    (`perfmodel.prefill_step`, the entry's costs, the engine's graph size and chunk from the flags, the
    router's ties under dummy weights), the difference being the request's fixed cost. `launch_wait`: the
    share of the GPU's work a launched step waits on (default: the entry's); `loaded`: studies already loaded.
    Each point: the study, configuration, bucket, tokens, measured and model seconds, how the model prefills it
    (`graph` or `launched`), its CPU side (`cpu_s`) and its latent-attention layers."""
    from .analysis.calibration import _norm, completed

    base = copy.deepcopy(entry)
    old = (base.get("engines") or {}).get(engine, {}).pop("request", None) or {}
    wait = old.get("launch_wait") if launch_wait is None else launch_wait
    if wait:
        base["engines"][engine]["request"] = {"launch_wait": wait}
    m = Machine(completed(base))  # eager costs of a layer kind this host did not measure: carried, scaled
    prof = engine_profile(engine)
    pts = []
    for study_dir in study_dirs:
        sd = (loaded or {}).get(str(study_dir)) or load_study_data(Path(study_dir))
        s = sd.summary
        for cid in sd.config_ids:
            run = sd.runs[cid]
            ep = run.get("engine_params") or {}
            args = engine_args(ep.get("args"))
            facts = ((run.get("model") or {}).get("facts")) or {}
            gpus = run.get("gpus_used") or (run.get("client_host") or {}).get("gpus") or []
            if (ep.get("kind", "vllm") != engine or not facts.get("param_count") or not gpus
                    or _norm(gpus[0].get("name", "")) != _norm(entry["machine"]["name"])
                    or prof.layout(args).gpus > 1 or prof.speculative(args)
                    or perfmodel.mode_of(engine, args) != "graphs"):
                continue
            g = s[(s["config"] == cid) & (s["concurrency"] == 1) & (s["rate_rps"] <= 0)]
            ties = bool(perfmodel.router_ties(run))
            graph, chunk = prof.graph_prefill_tokens(args, facts.get("model_type")), prof.prefill_chunk_tokens(
                args, m.memory_bytes)
            mla = mla_layers(facts)
            for r in g.itertuples():
                n = float(r.prompt_tokens)
                if not (n > 0 and float(r.ttft_p50_s) > 0):  # no successful request at this level
                    continue
                step = perfmodel.prefill_step(m, engine, "graphs", facts, n, graph_tokens=graph, chunk=chunk, ties=ties)
                pts.append({"study": Path(study_dir).name, "config": cid, "bucket": r.bucket, "tokens": n,
                            "measured_s": float(r.ttft_p50_s), "model_s": step["total_s"], "how": step["how"],
                            "cpu_s": step["cpu_s"], "mla_layers": mla, "dense": not facts.get("num_experts") and not mla,
                            "started_at": str(run.get("started_at", ""))[:10]})
    return pts


def ttft_from(study_dirs: list[Path | str], add_to: str, engine: str = "vllm") -> dict[str, Any]:
    """The engine's fixed cost of a request (`perfmodel_terms.fit_request_cost`) from published TTFTs at
    concurrency 1 (`request_points`), stored in calibration entry `add_to` as `engines.<engine>.request` with its
    points, studies and dates; the model then gives TTFT as an estimate (its request cost + its prefill)."""
    target, entry = _entry(add_to, "--ttft-from")
    loaded = {str(d): load_study_data(Path(d)) for d in study_dirs}
    wait = terms.fit_launch_wait(lambda w: request_points(study_dirs, entry, engine, w, loaded))
    pts = request_points(study_dirs, entry, engine, wait or 0.0, loaded)
    try:
        fitted = terms.fit_request_cost(pts)
        if wait is not None:
            fitted["launch_wait"] = wait
    except ValueError as e:
        raise UserError(f"calibrate-hw --ttft-from: {e}; found {len(pts)} levels of {engine} with CUDA graphs on "
                        f"{entry['machine']['name']} in {', '.join(str(d) for d in study_dirs)}") from None
    dates = sorted({p["started_at"] for p in pts if p["started_at"]})
    studies = sorted({p["study"] for p in pts})
    _store_term(entry, engine, "request", target, {
        **fitted, "points": [{k: p[k] for k in ("study", "config", "bucket", "tokens", "measured_s", "model_s", "how")}
                             for p in pts],
        "measured_at": f"{dates[0]}..{dates[-1]}" if dates else None,
        "source": f"median TTFT at c=1 less the model's prefill steps over {len(pts)} levels of {', '.join(studies)} "
                  f"(measured {dates[0] if dates else '?'} to {dates[-1] if dates else '?'}; calibrate-hw --ttft-from)"})
    progress_line(f"calibrate-hw: {engine} request cost {fitted['request_s'] * 1e3:.2f} ms (median of {fitted['n']} "
                  f"levels' TTFT less the model's prefill), launched steps wait on {wait or 0.0:.2f} of the shorter "
                  f"of their launches and the GPU's work, into {target}")
    return entry


def mla_prefill_from(study_dirs: list[Path | str], add_to: str, engine: str = "vllm") -> dict[str, Any]:
    """Latent attention's launches inside a captured graph's prefill (`perfmodel_terms.fit_graph_prefill`) from
    published TTFT sweeps at concurrency 1 with CUDA graphs (`request_points`): in each study, the latent-attention
    levels prefilled inside a graph less that study's request cost (the median residual of its levels prefilled in a
    graph without latent attention or experts) and the graph's floor, per layer; each study's values put on the entry's
    host by the ratio of the entry's request cost to the study's. Stored in calibration entry `add_to` as
    `engines.<engine>.mla_graph_prefill` with its points, studies and dates."""
    target, entry = _entry(add_to, "--mla-prefill-from")
    base = copy.deepcopy(entry)
    (base.get("engines") or {}).get(engine, {}).pop("mla_graph_prefill", None)
    req = (((base.get("engines") or {}).get(engine) or {}).get("request") or {}).get("request_s")
    if not req:
        raise UserError(f"calibrate-hw --mla-prefill-from: {add_to} has no request cost yet (calibrate-hw --ttft-from)")
    pts, studies = [], []
    for d in study_dirs:
        got = [p for p in request_points([d], base, engine) if p["how"] == "graph"]
        try:
            fitted = terms.fit_graph_prefill(got)
        except ValueError:
            continue
        host = fitted["request_s"] / float(req)
        pts += [{**p, "layer_s": p["layer_s"] / host, "host_x": host} for p in fitted["points"]]
        studies.append(Path(d).name)
    if len(pts) < 2:
        raise UserError(f"calibrate-hw --mla-prefill-from: no study of {', '.join(str(d) for d in study_dirs)} has two "
                        f"levels of a latent-attention model and two of a dense one prefilled inside CUDA graphs at c=1 "
                        f"with {engine} on {entry['machine']['name']}")
    layer_s = float(np.median([p["layer_s"] for p in pts]))
    dates = sorted({p["started_at"] for p in pts if p.get("started_at")})
    _store_term(entry, engine, "mla_graph_prefill", target, {
        "layer_s": layer_s, "n": len(pts), "points": pts, "measured_at": f"{dates[0]}..{dates[-1]}" if dates else None,
        "source": f"{', '.join(studies)}: TTFT at c=1 of latent-attention levels prefilled inside CUDA graphs, less "
                  "the study's request cost and the graph's floor, per layer, on this entry's host by the two request "
                  "costs (calibrate-hw --mla-prefill-from)"})
    progress_line(f"calibrate-hw: {engine} latent attention inside a graph's prefill {layer_s * 1e6:.0f} us a layer "
                  f"(median of {len(pts)} levels of {', '.join(studies)}) into {target}")
    return entry


def host_points(study_dir: Path | str, entry: dict[str, Any], engine: str = "vllm") -> tuple[list[dict[str, Any]], Any]:
    """A study's levels at concurrency 1 that the host factor moves (`analysis.hosts`): each configuration's
    median TTFT and median TPOT per bucket, with the model's figure as a function of the factor (`model`), for
    the configurations `request_points` takes (`engine` with CUDA graphs on one GPU of the entry's kind); and the
    study's data, loaded for them."""
    from .analysis.calibration import completed

    base = completed(entry)
    sd = load_study_data(Path(study_dir))
    s = sd.summary
    wanted = {(p["config"], p["bucket"]) for p in request_points([study_dir], entry, engine)}
    pts = []
    for cid in sorted({c for c, _ in wanted}):
        run = sd.runs[cid]
        facts = run["model"]["facts"]
        args = engine_args((run.get("engine_params") or {}).get("args"))
        ties = perfmodel.router_ties(run)
        for r in s[(s["config"] == cid) & (s["concurrency"] == 1) & (s["rate_rps"] <= 0)].itertuples():
            if (cid, r.bucket) not in wanted:
                continue
            n_in, n_out = int(round(float(r.prompt_tokens))), int(round(float(r.output_tokens_p50)))

            def model(f: float, q: str, n_in: int = n_in, n_out: int = n_out, facts: Any = facts, args: Any = args,
                      ties: Any = ties) -> float:
                p = perfmodel.predict(facts, engine, args, Machine(base, scale_host=f), input_tokens=n_in,
                                      output_tokens=max(n_out, 2), concurrency=[1], identical=bool(ties), ties=ties,
                                      band=False)
                return float(p[q])
            pts.append({"config": cid, "bucket": r.bucket, "quantity": "ttft_c1_s", "measured_s": float(r.ttft_p50_s),
                        "model": lambda f, m=model: m(f, "ttft_c1_s")})
            if n_out > 2 and r.tpot_p50_s == r.tpot_p50_s:
                pts.append({"config": cid, "bucket": r.bucket, "quantity": "c1_tpot_s", "measured_s": float(r.tpot_p50_s),
                            "model": lambda f, m=model: m(f, "c1_tpot_s")})
    return pts, sd


def hosts_from(study_dirs: list[Path | str], add_to: str, engine: str = "vllm") -> dict[str, Any]:
    """Each published study's host factor (`analysis.hosts.fit_factor` over `host_points`: its CPU-side time over
    the calibration host's), stored in calibration entry `add_to` as `hosts_seen` (one row per study, replacing a
    row of the same study); before you rent, the model takes their geometric mean and the band spans them."""
    from .analysis.hosts import fit_factor

    target, entry = _entry(add_to, "--hosts-from")
    base = copy.deepcopy(entry)
    base.pop("hosts_seen", None)
    rows = {h["study"]: h for h in entry.get("hosts_seen") or []}
    for study_dir in study_dirs:
        pts, sd = host_points(study_dir, base, engine)
        try:
            fitted = fit_factor([(p["measured_s"], p["model"]) for p in pts])
        except ValueError as e:
            raise UserError(f"calibrate-hw --hosts-from {study_dir}: {e} of {engine} with CUDA graphs on "
                            f"{entry['machine']['name']} at c=1; found {len(pts)}") from None
        started = min(str(r.get("started_at", ""))[:10] for r in sd.runs.values())
        probes = [r["host_probe"]["launch_eager_s"] for r in sd.runs.values() if (r.get("host_probe") or {}).get("launch_eager_s")]
        name = Path(study_dir).name
        rows[name] = {"study": name, "measured_at": started, "factor": round(fitted["factor"], 4), "n": fitted["n"],
                      "levels": [{"config": p["config"], "bucket": p["bucket"], "quantity": p["quantity"],
                                  "measured_s": p["measured_s"], "log_error": round(e, 4)}
                                 for p, e in zip(pts, fitted["log_errors"]) if e is not None],
                      **({"launch_eager_s": probes[0]} if probes else {}),
                      "source": f"{name}: c=1 TTFT and TPOT of {len({p['config'] for p in pts})} configuration(s), the "
                                "model's CPU-side terms scaled by one factor (calibrate-hw --hosts-from)"}
        progress_line(f"calibrate-hw: {name}: host factor x{fitted['factor']:.2f} over {fitted['n']} levels")
    entry["hosts_seen"] = list(rows.values())
    target.write_text(yaml.safe_dump(entry, sort_keys=False, width=120), encoding="utf-8")
    return entry
