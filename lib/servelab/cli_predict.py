"""`servelab calibrate-hw` (measure this machine for the performance model) and `servelab predict
PARAMS` (what a study's configurations should do on a machine, before renting or running anything:
the "before I rent" answer). The commands' words only: `calibrate_hw` and `analysis.perfmodel` do
the work. Not for running studies (`pipeline`)."""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace
from typing import Any

from .errors import UserError


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def cmd_calibrate_hw(a: argparse.Namespace) -> int:
    from .calibrate_hw import calibrate_hw

    return calibrate_hw(engine=a.engine, kinds=_csv(a.kinds) if a.kinds else None,
                        widths=[int(x) for x in _csv(a.widths)] if a.widths else None,
                        layers=[int(x) for x in _csv(a.layers)] if a.layers else None,
                        modes=_csv(a.modes) if a.modes else None, out=a.out, cal_id=a.id, micro_only=a.micro_only,
                        concurrent=a.concurrent, port_base=a.port_base, quick=a.quick,
                        add_to=a.add_to)


def _machine_record(study: Any, hardware: str | None) -> tuple[dict[str, Any], str]:
    """A run record's machine fields for the prediction: the GPU named (or the study's), else this CPU."""
    from .analysis.calibration import calibrations

    from .hosts import get as host_class

    name = hardware
    if name is None and (study.device is not None or not host_class(study.host.kind).engine_here):
        gpus = [c for c in calibrations() if c["machine"]["kind"] == "gpu"]
        if not gpus:
            raise UserError("no GPU calibration entry (data/calibrations/): give --hardware or run calibrate-hw")
        name = gpus[-1]["machine"]["name"]
    if name and name.lower() != "cpu":
        from .analysis.calibration import calibration_for

        entry, own = calibration_for("gpu", name)
        mem = (entry or {}).get("machine", {}).get("memory_bytes") if own else None
        return {"gpus_used": [{"name": name, "memory": f"{mem / 2**20:.0f} MiB" if mem else ""}]}, name
    from .measure.probe import measure_cpu_bandwidth

    probe = measure_cpu_bandwidth(seconds=1.0)
    return {"hardware_measured": probe}, f"this CPU ({probe.get('cpu_model')}, {probe.get('cpu_count')} cores)"


def _fmt(v: Any, scale: float = 1.0, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    x = float(v) * scale
    return f"{x:,.3g}{unit}" if abs(x) < 1000 else f"{x:,.0f}{unit}"


def cmd_predict(a: argparse.Namespace) -> int:
    from .analysis.perfmodel import predict_configuration
    from .hosts.local import model_dir_for
    from .models import model_facts
    from .runfolder import now_iso
    from .schema import load_study
    from .stages import bucket_lengths

    study = load_study(a.params)
    machine, where = _machine_record(study, a.hardware)
    ids = a.config or [c.id for c in study.configurations]
    unknown = sorted(set(ids) - {c.id for c in study.configurations})
    if unknown:
        raise UserError(f"{a.params}: no configuration {', '.join(unknown)}")
    print(f"{study.study}: predicted on {where}, before any request (servelab's performance model)")
    for cid in ids:
        eng = study.engine_for(cid)
        wl = study.workload_for(cid)
        mdir = model_dir_for(eng)
        rec = {"study": study.study, "config": cid, "engine_params": eng.model_dump(), **machine,
               "model": {"facts": model_facts(mdir)}}
        server = SimpleNamespace(base_url="http://127.0.0.1:9", model=mdir, headers={}, tokenizer_dir=mdir)
        pred = predict_configuration(rec, wl, study.slo.model_dump(), bucket_lengths(wl, server), now_iso())
        if pred.get("not_predictable"):
            print(f"{cid}: not predictable: {pred['not_predictable']}")
            continue
        mach = pred.get("machine") or {}
        cal = (f"calibration {mach['calibration']} ({mach['name']}, measured {str(mach['measured_at'])[:10]})"
               if mach.get("calibration") else f"roofline bounds ({mach.get('why')})")
        print(f"{cid}: {cal}")
        for label, p in pred["buckets"].items():
            kinds = p.get("kinds") or {}
            tp = ", ".join(f"c={c} {_fmt(v, 1000, ' ms')}" for c, v in sorted(p["tpot_s"].items(), key=lambda x: int(x[0])))
            print(f"  {label}: TPOT {tp} ({kinds.get('tpot_s')}); TTFT c=1 {_fmt(p['ttft_c1_s'], 1000, ' ms')}; "
                  f"prefill {_fmt(p['prefill_tok_s'])} tok/s; KV-limited concurrency {_fmt(p['kv_limited_concurrency'])}"
                  f"; capacity at SLO {_fmt(p.get('capacity_rps'))} req/s (c={p.get('capacity_concurrency')}, "
                  f"{p.get('capacity_binding')})")
            for why in p.get("bound_because") or []:
                print(f"    bound: {why}")
    return 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser("calibrate-hw", help="measure this machine for the performance model (data/calibrations/)")
    c.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    c.add_argument("--kinds", help="layer kinds: dense,moe,mla (default: all on a GPU, dense on a CPU)")
    c.add_argument("--widths", help="calibration widths (default 256 on a GPU; 256,1024 on a CPU)")
    c.add_argument("--layers", help="depths: 2,4,8 (the default), 16,32,64 (a GPU's deeper pass, with --add-to)")
    c.add_argument("--add-to", metavar="ID", help="pool this pass into the existing entry ID and fit it again")
    c.add_argument("--modes", help="graphs,eager (default: both on a GPU, eager on a CPU)")
    c.add_argument("--micro-only", action="store_true", help="the micro-benchmarks only, no engine")
    c.add_argument("--concurrent", type=int, help="servers started at once (default: all on a GPU, 1 on a CPU)")
    c.add_argument("--port-base", type=int, default=8600)
    c.add_argument("--id", help="entry id (default <machine>-<date>)")
    c.add_argument("--out", help="entry file (default lib/servelab/data/calibrations/<id>.yaml)")
    c.add_argument("--quick", action="store_true", help="small buffers (a check of the procedure, not a calibration)")
    c.set_defaults(fn=cmd_calibrate_hw)

    p = sub.add_parser("predict", help="what a study's configurations should do, before running anything")
    p.add_argument("params")
    p.add_argument("--config", action="append", help="only this configuration (repeatable)")
    p.add_argument("--hardware", help="a calibrated GPU's name (e.g. 'NVIDIA H200'), or cpu for this machine "
                                      "(default: the study's: a local study this CPU, a GPU study the newest GPU entry)")
    p.set_defaults(fn=cmd_predict)


__all__ = ["add_parser", "cmd_calibrate_hw", "cmd_predict"]
