"""Predictions before anything is measured: what the performance model expects of a configuration
(`analysis.perfmodel.predict_configuration`) on the machine named or this one, stored beside a run
(prediction.json, written by `stages`) and printed by `servelab predict` and the dry run. Not for the
model's arithmetic (`analysis.perfmodel`) nor for measuring (`stages`)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .analysis.calibration import calibrations, gpu_machine
from .analysis.perfmodel import predict_configuration
from .errors import UserError
from .hosts import get as host_class
from .hosts.local import model_dir_for
from .measure.probe import measure_cpu_bandwidth
from .measure.workload import token_counter
from .models import model_facts
from .prompts import load_set
from .runfolder import now_iso


def prediction(study: Any, config_id: str, rec: dict[str, Any], server: Any = None) -> dict[str, Any]:
    """What the performance model predicts (`analysis.perfmodel`: the model facts, the engine's flags
    and the machine's calibration), to be stored in prediction.json before the first request so it
    can never be fitted to the result it is compared with; what is missing says "not predictable"
    with the fact. Never raises: a prediction is a record, not a reason to stop a measurement."""
    wl = study.workload_for(config_id)
    try:
        return predict_configuration(rec, wl, study.slo.model_dump(), bucket_lengths(wl, server), now_iso("microseconds"))
    except Exception as e:  # noqa: BLE001 - said so in the file instead
        return {"stored_at": now_iso(), "stored_before_measurement": True,
                "not_predictable": f"the model failed: {type(e).__name__}: {e}"}


def prediction_machine(study: Any, hardware: str | None) -> tuple[dict[str, Any], str]:
    """A run record's machine fields for a prediction before anything runs (`servelab predict`, the dry run):
    the GPU named (or the study's: one placed on GPUs or a remote host, the newest calibrated GPU), else this CPU."""
    name = hardware
    if name is None and (study.placement.on_gpus or not host_class(study.host.kind).engine_here):
        gpus = [c for c in calibrations() if c["machine"]["kind"] == "gpu"]
        if not gpus:
            raise UserError("no GPU calibration entry (data/calibrations/): give --hardware or run calibrate-hw")
        name = gpus[-1]["machine"]["name"]
    if name and name.lower() != "cpu":
        m, _ = gpu_machine(name)
        mem = m.memory_bytes if m is not None else None
        return {"gpus_used": [{"name": name, "memory": f"{mem / 2**20:.0f} MiB" if mem else ""}]}, name
    probe = measure_cpu_bandwidth(seconds=1.0)
    return {"hardware_measured": probe}, f"this CPU ({probe.get('cpu_model')}, {probe.get('cpu_count')} cores)"


def prediction_lines(study: Any, config_id: str, machine: dict[str, Any]) -> list[str]:
    """A configuration's prediction in words (`servelab predict`, the dry run): the calibration it used, per
    bucket TPOT at every concurrency with its kind (estimate or bound), TTFT, prefill, the KV-limited
    concurrency and the capacity, and why a bound is one. Builds the model directory (offline) for its facts."""
    eng, wl = study.engine_for(config_id), study.workload_for(config_id)
    mdir = model_dir_for(eng)
    cfg_path = Path(mdir) / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    rec = {"study": study.study, "config": config_id, "engine_params": eng.model_dump(), **machine,
           "model": {"facts": model_facts(mdir), "config": cfg}}  # the config: a router that ties under dummy weights
    server = SimpleNamespace(base_url="http://127.0.0.1:9", model=mdir, headers={}, tokenizer_dir=mdir)
    pred = predict_configuration(rec, wl, study.slo.model_dump(), bucket_lengths(wl, server), now_iso())
    if pred.get("not_predictable"):
        return [f"{config_id}: not predictable: {pred['not_predictable']}"]
    mach = pred.get("machine") or {}
    carried = f"terms carried from {mach['transferred_from']} to {mach['name']} by the datasheets, " \
        if mach.get("transferred_from") else ""
    out = [f"{config_id}: " + (f"{carried}calibration {mach['calibration']} ({mach['name']}, measured "
                               f"{str(mach['measured_at'])[:10]})" if mach.get("calibration")
                               else f"roofline bounds ({mach.get('why')})")]
    for label, p in pred["buckets"].items():
        kinds = p.get("kinds") or {}
        band = p.get("band") or {}
        tp = ", ".join(f"c={c} {fmt_value(v, 1000, ' ms')}{band_text(band.get('tpot_s', {}).get(c))}"
                       for c, v in sorted(p["tpot_s"].items(), key=lambda x: int(x[0])))
        out.append(f"  {label}: TPOT {tp} ({kinds.get('tpot_s')}); TTFT c=1 {fmt_value(p['ttft_c1_s'], 1000, ' ms')}"
                   f"{band_text(band.get('ttft_c1_s'))} ({kinds.get('ttft_c1_s', 'bound')}); "
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


def band_text(b: Any, scale: float = 1000.0) -> str:
    """" (lo-hi)" of an estimate's band in ms, "" without one."""
    if not b or any(x is None or not math.isfinite(float(x)) for x in b):
        return ""
    return f" ({fmt_value(b[0], scale)}-{fmt_value(b[1], scale)})"


def bucket_lengths(wl: Any, server: Any = None) -> dict[str, tuple[int | None, int | None]]:
    """Each bucket's (input, output) tokens for a prediction: as set, or for a prompt set the
    median of its prompts counted by the server's tokenizer (no request is sent); None where
    neither is known (a trace, a session, no server to count with)."""
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


__all__ = ["band_text", "bucket_lengths", "fmt_value", "prediction", "prediction_lines", "prediction_machine"]
