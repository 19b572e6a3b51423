"""`servelab calibrate-hw`: measure the machine for the performance model (`analysis.perfmodel`) and
store the result as a dated calibration entry (`data/calibrations/<id>.yaml`).

1. Micro-benchmarks with torch (`measure.hwbench`): copy bandwidth, decode-like GEMV bandwidth at
   batch 1, 8, 32, GEMM throughput at prefill-like shapes, kernel launch cost; on a CPU also the
   numpy probe every local run records (`measure.probe`), so another CPU of the kind can be scaled.
2. The engine sweep: calibration models (`models.presets`: `calib-<kind>-w<width>-l<layers>`, dense /
   moe / mla layers, 2, 4 and 8 deep) served by the engine in each mode (CUDA graphs and eager; the
   CPU engine: eager), each measured at concurrency 1 with servelab's own client (an ordinary run
   folder under runs/calibrate-hw/<id>/); TPOT against depth gives the engine's fixed cost per layer
   and per step (`perfmodel.fit_fixed_costs`); on the CPU engine a second width gives the engine's
   own decode bandwidth (`perfmodel.fit_engine_bandwidth`).

On a GPU every server starts at once (small models: the GPU holds them all) and they are measured
one at a time; on a CPU one at a time. Not for the model itself (`analysis.perfmodel`).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from . import yamlio

from .analysis.calibration import (calibration_for, fit_collective, fit_engine_bandwidth, fit_fixed_costs,
                                   fit_graph_costs)
from .analysis.perfmodel import weight_bytes
from .analysis.transfer import dense_eager_ratio
from .engines import get as engine_profile
from .errors import UserError
from .hosts.local import model_dir_for
from .hosts.process import Engine
from .log import progress_line
from .measure import collectives, hwbench
from .measure.probe import measure_cpu_bandwidth
from .measure.runinfo import base_record
from .measure.runner import run_workload
from .models.facts import model_facts
from .models.presets import CALIB_KINDS, CALIB_LAYERS, CALIB_WIDTHS, calib_name
from .paths import runs_root
from .runfolder import RunFolder
from .schema import Bucket, EngineParams, Workload
from .tables import CALIBRATIONS

OUTPUT_TOKENS = 128
REQUESTS = 8


def _slug(s: str) -> str:
    return "-".join("".join(ch if ch.isalnum() else " " for ch in s.lower()).split())


def plan(kinds: list[str], widths: list[int], layers: list[int], modes: list[str]) -> list[dict[str, Any]]:
    """The calibration servers: one per kind, width, depth and mode."""
    for k in kinds:
        if k not in CALIB_KINDS:
            raise UserError(f"calibrate-hw: unknown kind {k!r}; known: {', '.join(CALIB_KINDS)}")
    for w in widths:
        if w not in CALIB_WIDTHS:
            raise UserError(f"calibrate-hw: width {w} has no calibration model; known: {CALIB_WIDTHS}")
    for n in layers:
        if n not in CALIB_LAYERS:
            raise UserError(f"calibrate-hw: {n} layers has no calibration model; known: {CALIB_LAYERS}")
    return [{"preset": calib_name(k, w, n), "kind": k, "width": w, "layers": n, "mode": m}
            for m in modes for k in kinds for w in widths for n in layers]


def _engine_params(item: dict[str, Any], engine: str, port: int, gpu: bool) -> Any:
    args = engine_profile(engine).calibration_args(eager=item["mode"] == "eager", gpu=gpu)
    return EngineParams(kind=engine, model={"preset": item["preset"]}, port=port, args=args, load_format="dummy",
                        entrypoint="api_server", startup_timeout_s=900)


def _workload() -> Any:
    return Workload(api="completions", buckets=[Bucket(input_tokens=32, output_tokens=OUTPUT_TOKENS)], concurrency=[1],
                    warmup_rounds=1, rounds=REQUESTS, requests_per_round=1, temperature=0, metrics_interval_s=0)


def measure_point(engine_obj: Any, item: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One calibration server at concurrency 1: its median TPOT and the weight bytes a step reads."""
    rec = base_record("calibrate-hw", item["preset"])
    run_workload(engine_obj.server(), _workload(), run_dir, study="calibrate-hw", config_id=item["preset"], record=rec,
                 progress=False)
    recs = RunFolder(run_dir).records
    ok = recs[(recs["ok"]) & (~recs["warmup"])] if len(recs) else recs
    tpots = [float(x) for x in ok["tpot_s"].dropna()]
    if not tpots:
        raise RuntimeError(f"{item['preset']}: no successful request")
    facts = model_facts(Path(engine_obj.model_dir))
    return {**item, "tpot_s": statistics.median(tpots), "requests": len(tpots),
            "weight_bytes": weight_bytes(facts, 1), "startup_s": engine_obj.startup_s}


def run_sweep(items: list[dict[str, Any]], engine: str, out_dir: Path, *, gpu: bool, port_base: int,
              concurrent: int) -> list[dict[str, Any]]:
    """Start the servers `concurrent` at a time, measure each once all of its batch answer."""

    points, port = [], port_base
    for i in range(0, len(items), max(1, concurrent)):
        batch = items[i:i + max(1, concurrent)]
        engines = []
        for it in batch:
            p = _engine_params(it, engine, port, gpu)
            port += 1
            engines.append((it, Engine(p, str(model_dir_for(p)), out_dir / "engines" / f"{it['preset']}-{it['mode']}")))
        t0 = time.monotonic()

        def start(pair: tuple[dict[str, Any], Any]) -> str | None:
            try:
                pair[1].start()
                return None
            except Exception as e:  # noqa: BLE001 - one failed calibration server is recorded, not fatal
                return f"{type(e).__name__}: {str(e)[-400:]}"
        with ThreadPoolExecutor(max_workers=len(engines)) as ex:
            errors = list(ex.map(start, engines))
        progress_line(f"calibrate-hw: {sum(e is None for e in errors)}/{len(engines)} servers up in "
                      f"{time.monotonic() - t0:.0f} s")
        try:
            for (it, eng), err in zip(engines, errors):
                if err:
                    progress_line(f"calibrate-hw: {it['preset']} {it['mode']} did not start: {err}")
                    continue
                try:
                    pt = measure_point(eng, it, out_dir / "runs" / f"{it['preset']}-{it['mode']}")
                    points.append(pt)
                    progress_line(f"calibrate-hw: {it['preset']} {it['mode']}: TPOT {pt['tpot_s'] * 1000:.3f} ms")
                except Exception as e:  # noqa: BLE001
                    progress_line(f"calibrate-hw: {it['preset']} {it['mode']} not measured: {type(e).__name__}: {e}")
        finally:  # every server at once: one after another, each waiting out its grace, took minutes
            with ThreadPoolExecutor(max_workers=len(engines)) as ex2:
                list(ex2.map(lambda pair: pair[1].stop(grace_s=5.0), engines))
    return points


def fit(points: list[dict[str, Any]], micro: dict[str, Any], engine: str,
        known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The engine's calibration: fixed costs per mode and kind (narrowest width), and on a CPU its own
    bandwidth from the two widths (else `known`'s, an earlier fit of the same engine: a second pass
    of one width keeps it)."""
    out: dict[str, Any] = {}
    widths = sorted({p["width"] for p in points})
    bw = float(micro["decode_bandwidth_Bps"]["1"])
    if known and known.get("bandwidth_Bps"):
        bw = float(known["bandwidth_Bps"])
        out.update(bandwidth_Bps=bw, bandwidth_source=known.get("bandwidth_source"))
    if len(widths) >= 2 and micro.get("device") == "cpu":
        slopes = {}
        for w in widths[:1] + widths[-1:]:
            pts = [p for p in points if p["width"] == w and p["kind"] == "dense" and p["mode"] == "eager"]
            if len({p["layers"] for p in pts}) >= 2:
                b = np.polyfit([p["layers"] for p in pts], [p["tpot_s"] for p in pts], 1)[0]
                per_layer = np.polyfit([p["layers"] for p in pts], [p["weight_bytes"] for p in pts], 1)[0]
                slopes[w] = ({"layer_slope_s": float(b)}, float(per_layer))
        if len(slopes) == 2:
            (n, nb), (wd, wb) = slopes[widths[0]], slopes[widths[-1]]
            bw = fit_engine_bandwidth(n, wd, nb, wb)
            out["bandwidth_Bps"] = bw
            out["bandwidth_source"] = (f"per-layer time of {widths[-1]}-wide over {widths[0]}-wide dense calibration "
                                       "models against their extra weight bytes")
    narrow = min(widths)
    for mode in sorted({p["mode"] for p in points}):
        per = {}
        for kind in sorted({p["kind"] for p in points}):
            pts = [{k: p[k] for k in ("layers", "tpot_s", "weight_bytes")}
                   for p in points if p["mode"] == mode and p["kind"] == kind and p["width"] == narrow]
            if len({p["layers"] for p in pts}) < 2:
                continue
            # with CUDA graphs the deep models leave the CPU side's floor (fit_graph_costs): the line is
            # fitted on the shallow ones; eager steps (and a CPU's) grow with every layer: all of them
            shallow = [p for p in pts if p["layers"] <= 8] if mode == "graphs" else pts
            per[kind] = fit_fixed_costs(shallow if len({p["layers"] for p in shallow}) >= 2 else pts, bw)
            if mode == "graphs" and micro.get("device") == "cuda":  # the CPU side's floor, the GPU's costs
                per[kind].update({k: v for k, v in fit_graph_costs(pts, bw).items() if k != "points"})
                per[kind]["points"] = pts
        if per:
            out[mode] = per
    return out


def _host_scaled_eager(a: dict[str, Any], b: dict[str, Any], eng: str, micro: dict[str, Any]) -> dict[str, Any]:
    """The eager kinds of pass `b` that entry `a` lacks, put on `a`'s host when `b` ran on another one (its dense
    eager points differ from `a`'s): fitted on `b`'s points, each kind's cost per layer and per step times `a`'s
    dense eager cost over `b`'s (the rule `analysis.transfer` carries eager kinds by), with the factors and `b`'s
    host probe recorded. {} when `b` measured no dense eager line or the same one (pooled as usual)."""
    ea = ((a.get("engines") or {}).get(eng) or {}).get("eager") or {}
    eb = ((b.get("engines") or {}).get(eng) or {}).get("eager") or {}
    da, db = ea.get("dense") or {}, eb.get("dense") or {}
    if not da.get("layer_s") or not db.get("layer_s") or da.get("points") == db.get("points"):
        return {}
    f_layer, f_step = dense_eager_ratio(ea, eb)
    pts = [{**p, "mode": "eager", "kind": k, "width": 256} for k, c in eb.items() if k not in ea and isinstance(c, dict)
           for p in c.get("points", [])]
    fitted = fit(pts, micro, eng).get("eager", {}) if pts else {}
    probe = (b.get("micro") or {}).get("launch_eager_s")
    return {k: {**c, "layer_s": c["layer_s"] * f_layer, "step_s": c["step_s"] * f_step,
                "host_scaled": {"layer_x": f_layer, "step_x": f_step, "measured_at": str(b.get("measured_at", ""))[:10],
                                "launch_eager_s": probe,
                                "rule": "measured on another host of this GPU, x this entry's dense eager costs over "
                                        "that host's (per layer, per step)"}}
            for k, c in fitted.items()}


def merge(main: Path, other: Path) -> dict[str, Any]:
    """One entry from two calibrations of the same machine (deeper models measured in a second
    pass): the points of each engine, mode and kind pooled and fitted again; `other` removed. A second
    pass of eager costs from another host (`_host_scaled_eager`) adds the kinds the entry lacks, put on
    the entry's host, and pools none of its eager points."""
    a, b = yamlio.safe_load(main.read_text()), yamlio.safe_load(other.read_text())
    micro = {**a["micro"], "device": "cuda" if a["machine"]["kind"] == "gpu" else "cpu"}
    other_host = False
    for eng, modes in (b.get("engines") or {}).items():
        scaled = _host_scaled_eager(a, b, eng, micro)
        if scaled:
            b["engines"][eng].pop("eager", None)
            other_host = True
        # kinds put on this host from another one keep their scaled fit (their points are the other host's)
        scaled = {**{k: c for k, c in ((a["engines"].get(eng) or {}).get("eager") or {}).items()
                     if isinstance(c, dict) and c.get("host_scaled")}, **scaled}
        pts = []
        for src in (a, b):
            for mode, per in ((src.get("engines") or {}).get(eng) or {}).items():
                if isinstance(per, dict):
                    for kind, c in per.items():
                        if isinstance(c, dict) and not (mode == "eager" and kind in scaled):
                            pts += [{**p, "mode": mode, "kind": kind, "width": 256} for p in c.get("points", [])]
        seen, uniq = set(), []
        for p in pts:
            key = (p["mode"], p["kind"], p["layers"])
            if key not in seen:
                seen.add(key)
                uniq.append(p)
        known = a["engines"].get(eng) or {}
        kept = {k: known[k] for k in ("moe_prefill", "request") if known.get(k)}
        a["engines"][eng] = {"version": known.get("version"), **fit(uniq, micro, eng, known), **kept}
        if scaled:
            a["engines"][eng].setdefault("eager", {}).update(scaled)
    what = "another host's eager costs" if other_host else "deeper calibration models"
    a["source"] += f"; {what}: " + b["source"].split(": ", 1)[-1]
    main.write_text(yaml.safe_dump(a, sort_keys=False, width=120), encoding="utf-8")
    other.unlink()
    return a


def calibrate_hw(*, engine: str = "vllm", kinds: list[str] | None = None, widths: list[int] | None = None,
                 layers: list[int] | None = None, modes: list[str] | None = None, out: str | None = None,
                 cal_id: str | None = None, micro_only: bool = False, concurrent: int | None = None,
                 port_base: int = 8600, quick: bool = False, add_to: str | None = None) -> int:
    t0 = time.monotonic()
    micro = hwbench.run(quick=quick)
    gpu = micro["device"] == "cuda"
    m = micro["machine"]
    progress_line(f"calibrate-hw: {m['name']} micro-benchmarks in {time.monotonic() - t0:.0f} s: copy "
                  f"{micro['copy_bandwidth_Bps'] / 1e9:.1f} GB/s, decode GEMV {micro['decode_bandwidth_Bps']['1'] / 1e9:.1f} GB/s")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    cal_id = cal_id or f"{_slug(m['name'])}-{date}"
    entry: dict[str, Any] = {
        "format_version": 1, "id": cal_id, "machine": m, "measured_at": micro["measured_at"],
        "source": f"servelab calibrate-hw on {m['name']} ({'GPU' if gpu else 'CPU'}), torch {m.get('torch')}",
        "micro": {k: micro[k] for k in ("copy_bandwidth_Bps", "decode_bandwidth_Bps", "decode_working_set_bytes",
                                        "gemm_flops", "gemm_shape", "launch_eager_s", "launch_graph_s") if k in micro},
        "engines": {},
    }
    if not gpu:
        entry["probe"] = measure_cpu_bandwidth(seconds=1.0)
    if not micro_only:
        kinds = kinds or (["dense", "moe", "mla"] if gpu else ["dense"])
        widths = widths or ([256] if gpu else [256, 1024])
        layers = layers or [2, 4, 8]
        modes = modes or (["graphs", "eager"] if gpu else ["eager"])
        items = plan(kinds, widths, layers, modes)
        folder = runs_root() / "calibrate-hw" / cal_id

        shutil.rmtree(folder, ignore_errors=True)  # calibrate-hw's own scratch: a new calibration measures anew
        points = run_sweep(items, engine, folder, gpu=gpu, port_base=port_base, concurrent=concurrent or (len(items) if gpu else 1))
        if not points:
            raise UserError(f"calibrate-hw: no calibration server could be measured (logs under {folder}/engines)")
        version = _engine_version(folder)
        entry["engines"][engine] = {"version": version, **fit(points, micro, engine)}
        entry["source"] += f", {engine} {version}: {len(points)} calibration servers ({', '.join(kinds)}; " \
                           f"widths {widths}; layers {layers}; {', '.join(modes)})"
    path = Path(out) if out else CALIBRATIONS / f"{cal_id}{'.more' if add_to else ''}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)

    plain = json.loads(json.dumps(entry, default=lambda x: float(x) if hasattr(x, "__float__") else str(x)))
    path.write_text(yaml.safe_dump(plain, sort_keys=False, width=120), encoding="utf-8")
    if add_to:  # a second pass (e.g. deeper models on a GPU) pooled into an existing entry and fitted again
        target = CALIBRATIONS / f"{add_to}.yaml"
        if not target.is_file():
            raise UserError(f"calibrate-hw --add-to: no calibration entry {target}")
        entry, path = merge(target, path), target
    progress_line(f"calibrate-hw: {path} in {time.monotonic() - t0:.0f} s")
    for mode, per in (entry["engines"].get(engine) or {}).items():
        if isinstance(per, dict) and all(isinstance(v, dict) for v in per.values()):
            for kind, c in per.items():
                print(f"{engine} {mode} {kind}: {c['layer_s'] * 1e6:.1f} us/layer + {c['step_s'] * 1e6:.0f} us/step "
                      f"(r2 {c['r2']:.3f}, {c['n']} servers)")
    return 0


def calibrate_collectives(add_to: str | None = None) -> dict[str, Any]:
    """`calibrate-hw --collectives`: all-reduce and all-to-all timed between this machine's GPUs
    (`measure.collectives`), fitted as alpha + bytes / beta per op and GPU count
    (`analysis.calibration.fit_collective`) and stored as `micro.collectives` of calibration entry `add_to`
    (default: the newest entry of this GPU). UserError (one line) with fewer than 2 GPUs."""
    try:
        raw = collectives.run()
    except ValueError as e:
        raise UserError(f"--collectives: {e}") from None
    if add_to is None:
        entry, own = calibration_for("gpu", raw["gpu"])
        if entry is None or not own:
            raise UserError(f"--collectives: no calibration entry of {raw['gpu']} to add to: run "
                            "calibrate-hw first (or give --add-to ID)")
        add_to = str(entry["id"])
    target = CALIBRATIONS / f"{add_to}.yaml"
    if not target.is_file():
        raise UserError(f"--collectives: no calibration entry {target}")
    data = yamlio.safe_load(target.read_text())
    fitted = {n: {op: fit_collective(pts) for op, pts in per.items()} for n, per in raw["points"].items()}
    data.setdefault("micro", {})["collectives"] = {**fitted, "nccl_env": raw["nccl_env"],
                                                   "measured_at": raw["measured_at"],
                                                   "source": "torch.distributed NCCL (calibrate-hw --collectives)"}
    target.write_text(yaml.safe_dump(data, sort_keys=False, width=120), encoding="utf-8")
    for n, per in fitted.items():
        for op, f in per.items():
            progress_line(f"calibrate-hw: {op} over {n} GPUs: {f['alpha_s'] * 1e6:.1f} us + bytes / "
                          f"{f['beta_Bps'] / 1e9:.1f} GB/s (max error {f['max_rel_err'] * 100:.0f} %) into {target}")
    return data


def _engine_version(folder: Path) -> str | None:
    for p in sorted((folder / "runs").glob("*/run.json")):
        v = (json.loads(p.read_text()).get("server") or {}).get("version")
        if v:
            return str(v)
    return None


__all__ = ["calibrate_collectives", "calibrate_hw", "fit", "merge", "plan", "run_sweep"]
