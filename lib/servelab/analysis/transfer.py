"""Carrying a calibration to a GPU that has none (`analysis.calibration.Machine`): each measured term
of the nearest calibrated GPU moves to the other GPU by what it depends on, and each says where it
came from, so `servelab predict --gpu "NVIDIA H100"` prints estimates with an uncertainty band
instead of the datasheet's bounds.

- Decode bandwidth (GEMV at batch 1, 8, 32): the calibrated GPU's measured share of its datasheet
  peak, times the other GPU's datasheet peak (HBM to HBM: the share within 10 %; across memory
  kinds, 20 %).
- GEMM throughput by rows: the calibrated share of the datasheet FLOP/s, times the other's (15 %).
  The SMs enter here: the datasheet FLOP/s is SMs x clock x the tensor cores' rate.
- The GPU's fixed time per layer (CUDA-graph calibration models: small, latency-bound kernels):
  scaled by the boost clocks (25 %).
- The host's terms (the engine's CPU side per step with CUDA graphs, its eager launch costs, the fixed
  cost of a request: HTTP, chat template, tokenization, scheduling): the calibrated host's, unless this
  GPU's own entry measured them; they depend on the host's CPU, not the GPU (their spread in the
  calibration: the floor over the shallow calibration models, the request cost's residuals).

A GPU with an entry of its own that holds only micro-benchmarks (`calibrate-hw --micro-only`) keeps
its measured bandwidth and GEMM throughput and takes the host's terms from the nearest calibrated
entry. `band_entries` gives the two ends of the band (every term at its favourable end, then at its
unfavourable one). No I/O but the shipped tables; not for the model's arithmetic (`perfmodel`)."""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .roofline import HARDWARE, get_hardware

#: relative half-widths of the transferred terms (the band): a rule's uncertainty, not a measurement
RANGE_BW_SAME_MEMORY = 0.10
RANGE_BW_OTHER_MEMORY = 0.20
RANGE_FLOPS = 0.15
RANGE_CLOCK = 0.25
RANGE_EAGER = 0.10  # the eager fits' scatter on the calibrated host (r2 0.97-0.996)
#: a host's CPU-side terms carried to another host as measured: two calibrated hosts (the H200's, 2026-12-02, and
#: the H100's, 2026-12-06) differ by 36 % in their CUDA-graph floor (2.49 and 1.59 ms) and 45 % in their eager step
RANGE_HOST = 0.40
#: a term carried to a host that measured a sibling of it (its dense eager costs, its floor), scaled by the two
RANGE_HOST_SCALED = 0.25


def _mem_family(hw: Mapping[str, Any]) -> str:
    return "hbm" if "HBM" in str(hw.get("memory_type", "")).upper() else "gddr"


def hardware_row(name: str) -> dict[str, Any] | None:
    try:
        return get_hardware(name)
    except KeyError:
        return None


def has_engine_costs(entry: Mapping[str, Any]) -> bool:
    return any(isinstance(e, Mapping) and (e.get("graphs") or e.get("eager"))
               for e in (entry.get("engines") or {}).values())


def nearest_calibrated(target: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(entry, its GPU's datasheet row) of the calibrated GPU nearest to `target` (a datasheet row) in
    bandwidth and FLOP/s (log distance), among entries with engine costs whose GPU has a datasheet row."""
    best = None
    for e in entries:
        if e["machine"]["kind"] != "gpu" or not has_engine_costs(e):
            continue
        row = hardware_row(str(e["machine"]["name"]))
        if row is None:
            continue
        d = (abs(math.log(float(target["memory_bandwidth_Bps"]) / float(row["memory_bandwidth_Bps"])))
             + abs(math.log(float(target["bf16_dense_flops"]) / float(row["bf16_dense_flops"]))))
        if best is None or d < best[0]:
            best = (d, dict(e), row)
    return (best[1], best[2]) if best else None


def _scaled(table: Mapping[str, Any], f: float) -> dict[str, float]:
    return {k: float(v) * f for k, v in table.items()}


def clock_ratio(source_hw: Mapping[str, Any], target: Mapping[str, Any]) -> tuple[float, str]:
    """(the source GPU's boost clock over the target's, 1 where either is unknown; "S / T MHz") : what a latency-bound
    kernel's time is carried by."""
    clk_s, clk_t = source_hw.get("boost_clock_hz"), target.get("boost_clock_hz")
    return (float(clk_s) / float(clk_t) if clk_t and clk_s else 1.0,
            f"{(clk_s or 0) / 1e6:.0f} / {(clk_t or 0) / 1e6:.0f} MHz")


def transferred_entry(target: Mapping[str, Any], source: Mapping[str, Any], source_hw: Mapping[str, Any],
                      own_micro: Mapping[str, Any] | None = None, own_id: str | None = None) -> dict[str, Any]:
    """A calibration entry for the GPU of datasheet row `target`, carried from calibration entry `source`
    (its GPU's row `source_hw`); `own_micro`: this GPU's own micro-benchmarks, kept as measured. The entry's
    `transfer` lists every term with its rule, source and relative range."""
    src_id = source.get("id")
    bw_f = float(target["memory_bandwidth_Bps"]) / float(source_hw["memory_bandwidth_Bps"])
    fl_f = float(target["bf16_dense_flops"]) / float(source_hw["bf16_dense_flops"])
    fp8_f = (float(target.get("fp8_dense_flops") or 0) / float(source_hw.get("fp8_dense_flops") or 1)) or fl_f
    clk_f, clocks = clock_ratio(source_hw, target)
    bw_range = RANGE_BW_SAME_MEMORY if _mem_family(target) == _mem_family(source_hw) else RANGE_BW_OTHER_MEMORY
    micro_src = dict(source.get("micro") or {})
    out: dict[str, Any] = {
        "format_version": 1, "id": own_id or f"{src_id}->{target['name']}",
        "machine": {"kind": "gpu", "name": target["name"], "memory_bytes": target.get("memory_bytes"), "count": 1},
        "measured_at": source.get("measured_at"),
        "source": f"carried from {src_id} ({source['machine']['name']}) to {target['name']} by the datasheets "
                  f"(data/hardware.yaml, as of {target.get('as_of')})",
        "transferred_from": src_id, "engines": copy.deepcopy(source.get("engines") or {}),
        "hosts_seen": copy.deepcopy(source.get("hosts_seen") or []),  # the host terms' hosts: the source's
    }
    transfer: list[dict[str, Any]] = []
    if own_micro:
        out["micro"] = dict(own_micro)
        transfer.append({"term": "decode bandwidth and GEMM throughput", "value": None, "range": 0.0,
                         "rule": "measured on this GPU (calibrate-hw --micro-only)", "source": own_id})
    else:
        micro = {k: v for k, v in micro_src.items() if k not in ("collectives",)}
        micro["decode_bandwidth_Bps"] = _scaled(micro_src.get("decode_bandwidth_Bps") or {}, bw_f)
        micro["copy_bandwidth_Bps"] = float(micro_src.get("copy_bandwidth_Bps") or 0) * bw_f
        gemm = micro_src.get("gemm_flops") or {}
        micro["gemm_flops"] = {p: _scaled(t, fp8_f if p == "fp8" else fl_f) for p, t in gemm.items()}
        out["micro"] = micro
        share = float((micro_src.get("decode_bandwidth_Bps") or {}).get("1", math.nan)) / float(source_hw["memory_bandwidth_Bps"])
        g = (gemm.get("bf16") or {})
        top = max(g, key=lambda k: float(k)) if g else None
        fshare = float(g[top]) / float(source_hw["bf16_dense_flops"]) if top else math.nan
        transfer += [
            {"term": "decode bandwidth", "value": float(micro["decode_bandwidth_Bps"].get("1", math.nan)),
             "range": bw_range,
             "rule": f"{source['machine']['name']}'s measured GEMV bandwidth is {share * 100:.0f} % of its datasheet "
                     f"{source_hw['memory_bandwidth_Bps'] / 1e12:g} TB/s; the same share of {target['name']}'s "
                     f"{target['memory_bandwidth_Bps'] / 1e12:g} TB/s",
             "source": f"{src_id} micro-benchmarks; data/hardware.yaml"},
            {"term": "GEMM throughput", "value": float(micro["gemm_flops"].get("bf16", {}).get(top, math.nan)) if top else None,
             "range": RANGE_FLOPS,
             "rule": f"the measured share of the datasheet bf16 FLOP/s ({fshare * 100:.0f} % at {top} rows) times "
                     f"{target['name']}'s {target['bf16_dense_flops'] / 1e12:g} TFLOP/s (SMs x clock x tensor rate)",
             "source": f"{src_id} micro-benchmarks; data/hardware.yaml"},
        ]
    for eng in out["engines"].values():
        if isinstance(eng, dict):
            for c in (eng.get("graphs") or {}).values():
                if isinstance(c, dict) and "gpu_layer_s" in c:
                    c["gpu_layer_s"] = float(c["gpu_layer_s"]) * clk_f
    transfer += [
        {"term": "GPU fixed time per layer", "value": clk_f, "range": RANGE_CLOCK,
         "rule": f"{source['machine']['name']}'s per-layer kernel time (latency-bound kernels) x its boost clock over "
                 f"{target['name']}'s ({clocks})",
         "source": f"{src_id} CUDA-graph calibration models; data/hardware.yaml clocks"},
        {"term": "engine CPU side, eager launch costs, request cost", "value": None, "range": RANGE_HOST,
         "rule": f"the host of {src_id} (the nearest calibrated host): they depend on the host's CPU, not the GPU",
         "source": f"{src_id} ({source['machine']['name']} host): not measured on this GPU's host"},
    ]
    out["transfer"] = transfer
    return out


def _floor(eng: Mapping[str, Any]) -> float | None:
    floors = [float(c["floor_s"]) for c in (eng.get("graphs") or {}).values() if isinstance(c, Mapping) and "floor_s" in c]
    return max(floors) if floors else None


def dense_eager_ratio(target: Mapping[str, Any], source: Mapping[str, Any]) -> tuple[float, float]:
    """(per layer, per step): one host's dense eager costs over another's (each an engine's `eager` costs), the rule
    an eager layer kind is carried between hosts by; 1.0 where either did not measure it."""
    t, s = target.get("dense") or {}, source.get("dense") or {}
    return tuple(float(t[k]) / float(s[k]) if s.get(k) and t.get(k) else 1.0  # type: ignore[return-value]
                 for k in ("layer_s", "step_s"))


def complete_entry(entry: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """This GPU's own entry with the host terms it lacks carried from `source` (the nearest calibrated entry that has
    them), each scaled by what both hosts measured: an eager layer kind by the ratio of their dense eager costs (per
    layer, per step), the request cost by the ratio of their CUDA-graph floors; and the GPU's per-layer kernel time of
    a layer kind this entry's shallow calibration models could not see, by the clocks; each listed in `transfer` with
    its rule and range. The entry unchanged (a copy) when it lacks nothing."""
    out = copy.deepcopy(dict(entry))
    carried = []
    for name, src in (source.get("engines") or {}).items():
        if not isinstance(src, Mapping):
            continue
        eng = out.setdefault("engines", {}).setdefault(name, {})
        if not isinstance(eng, dict) or not (eng.get("graphs") or eng.get("eager")):
            continue
        se, te = src.get("eager") or {}, eng.get("eager") or {}
        td = te.get("dense") or {}
        f_layer, f_step = dense_eager_ratio(te, se)
        missing = [k for k in se if k not in te and isinstance(se[k], Mapping)]
        if missing:
            eng["eager"] = {**te, **{k: {"layer_s": float(se[k]["layer_s"]) * f_layer, "step_s": float(se[k]["step_s"]) * f_step,
                                         "carried_from": source.get("id")} for k in missing}}
            carried.append({"term": "eager launch costs", "value": {"kinds": missing, "layer_x": f_layer, "step_x": f_step},
                            "range": RANGE_HOST_SCALED if td else RANGE_HOST,
                            "rule": f"{name}'s eager {', '.join(missing)} costs of {source.get('id')}'s host x this host's "
                                    f"measured dense eager costs over that host's ({f_layer:.2f} per layer, {f_step:.2f} "
                                    "per step)", "source": f"{source.get('id')}; {entry.get('id')}"})
        sg, tg = src.get("graphs") or {}, eng.get("graphs") or {}
        lacking = [k for k, c in tg.items() if isinstance(c, dict) and "gpu_layer_s" not in c
                   and isinstance(sg.get(k), Mapping) and "gpu_layer_s" in sg[k]]
        if lacking:  # no deeper calibration pass here: the GPU's per-layer kernel time carried by the clocks
            clk, clocks = clock_ratio(hardware_row(str(source["machine"]["name"])) or {},
                                      hardware_row(str(entry["machine"]["name"])) or {})
            for k in lacking:
                tg[k] = {**tg[k], "gpu_layer_s": float(sg[k]["gpu_layer_s"]) * clk,
                         "gpu_step_s": float(sg[k].get("gpu_step_s") or 0.0), "gpu_carried_from": source.get("id")}
            carried.append({"term": "GPU fixed time per layer", "value": clk, "range": RANGE_CLOCK,
                            "rule": f"{name}'s per-layer kernel time ({', '.join(lacking)}) of {source.get('id')}'s deeper "
                                    f"calibration models x its boost clock over this GPU's ({clocks}): this entry "
                                    "measured 2 to 8 layers only, whose time is the CPU side's floor",
                            "source": f"{source.get('id')} CUDA-graph calibration models; data/hardware.yaml clocks"})
        if src.get("request") and not eng.get("request"):
            ft, fs = _floor(eng), _floor(src)
            f = ft / fs if ft and fs else 1.0
            req = dict(src["request"])
            req.update(request_s=float(req["request_s"]) * f, residuals_s=[float(x) * f for x in req.get("residuals_s") or []],
                       carried_from=source.get("id"), points=[])
            eng["request"] = req
            carried.append({"term": "request cost", "value": req["request_s"], "range": RANGE_HOST_SCALED if ft else RANGE_HOST,
                            "rule": f"{name}'s request cost on {source.get('id')}'s host x the ratio of the two hosts' "
                                    f"CUDA-graph floors ({f:.2f}): both are the engine's Python on the host's CPU",
                            "source": f"{source.get('id')} (calibrate-hw --ttft-from); {entry.get('id')}"})
    if carried:
        out["transfer"] = list(out.get("transfer") or []) + carried
        out["completed_from"] = source.get("id")
    return out


def floor_range(entry: Mapping[str, Any], engine: str = "vllm") -> tuple[float, float]:
    """The CUDA-graph floor's spread on the calibrated host: (min, max) of the shallow calibration models'
    TPOT over the floor the model uses (the largest per kind), e.g. (0.80, 1.02)."""
    g = ((entry.get("engines") or {}).get(engine) or {}).get("graphs") or {}
    floors = [float(c["floor_s"]) for c in g.values() if isinstance(c, Mapping) and "floor_s" in c]
    pts = [float(p["tpot_s"]) for c in g.values() if isinstance(c, Mapping)
           for p in c.get("points") or [] if p.get("layers", 99) <= 8]
    if not floors or not pts:
        return 1.0, 1.0
    f = max(floors)
    return min(pts) / f, max(pts) / f


def request_range(entry: Mapping[str, Any], engine: str = "vllm") -> tuple[float, float]:
    """The request cost's spread: its fit's residuals' quartiles (`engines.<engine>.request.residuals_s`) as
    offsets in seconds, (lower, upper)."""
    r = ((entry.get("engines") or {}).get(engine) or {}).get("request") or {}
    res = [float(x) for x in r.get("residuals_s") or []]
    if len(res) < 4:
        return 0.0, 0.0
    q = statistics.quantiles(res, n=4)
    return q[0], q[2]


def band_entries(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fast, slow): the entry with every uncertain term at its favourable end, then its unfavourable one:
    the transferred terms by their ranges, the host's floor by its spread, its eager costs by 10 %, the
    request cost by its residuals' quartiles."""
    ranges = {t["term"]: t.get("range") for t in entry.get("transfer") or []}
    host = float(ranges.get("engine CPU side, eager launch costs, request cost") or 0.0)
    r_eager = max(RANGE_EAGER, host, float(ranges.get("eager launch costs") or 0.0))
    r_req = max(host, float(ranges.get("request cost") or 0.0))
    out = []
    for side in (-1, 1):  # -1: faster
        e = copy.deepcopy(dict(entry))
        micro = e.setdefault("micro", {})
        bw = 1.0 - side * float(ranges.get("decode bandwidth") or 0.0)
        fl = 1.0 - side * float(ranges.get("GEMM throughput") or 0.0)
        clk = 1.0 + side * float(ranges.get("GPU fixed time per layer") or 0.0)
        micro["decode_bandwidth_Bps"] = _scaled(micro.get("decode_bandwidth_Bps") or {}, bw)
        micro["gemm_flops"] = {p: _scaled(t, fl) for p, t in (micro.get("gemm_flops") or {}).items()}
        for name, eng in (e.get("engines") or {}).items():
            if not isinstance(eng, dict):
                continue
            lo, hi = floor_range(entry, name)
            for c in (eng.get("graphs") or {}).values():
                if isinstance(c, dict):
                    if "floor_s" in c:
                        c["floor_s"] = float(c["floor_s"]) * (lo if side < 0 else hi) * (1.0 + side * host)
                    if "gpu_layer_s" in c:
                        c["gpu_layer_s"] = float(c["gpu_layer_s"]) * clk
            for c in (eng.get("eager") or {}).values():
                if isinstance(c, dict):
                    r = r_eager if c.get("carried_from") or host else RANGE_EAGER
                    c["layer_s"] = float(c["layer_s"]) * (1.0 + side * r)
                    c["step_s"] = float(c["step_s"]) * (1.0 + side * r)
            if eng.get("request"):
                rlo, rhi = request_range(entry, name)
                base = float(eng["request"]["request_s"]) * (1.0 + side * r_req)
                eng["request"]["request_s"] = max(0.0, base + (rlo if side < 0 else rhi))
            if eng.get("bandwidth_Bps"):
                eng["bandwidth_Bps"] = float(eng["bandwidth_Bps"]) * bw
        out.append(e)
    return out[0], out[1]


def gpu_names() -> list[str]:
    """Every GPU of the hardware table (data/hardware.yaml), in its order."""
    return [h["name"] for h in HARDWARE]


__all__ = ["RANGE_HOST", "RANGE_HOST_SCALED", "complete_entry", "RANGE_BW_OTHER_MEMORY", "RANGE_BW_SAME_MEMORY", "RANGE_CLOCK", "RANGE_EAGER", "RANGE_FLOPS",
           "band_entries", "dense_eager_ratio", "floor_range", "gpu_names", "hardware_row", "has_engine_costs", "nearest_calibrated",
           "request_range", "transferred_entry"]
