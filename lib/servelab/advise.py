"""Which GPU and which flags serve a model at its SLO for the least money, before renting any: every GPU
of the hardware table (data/hardware.yaml; estimates where a calibration exists or can be carried,
`analysis.transfer`) and every lever of the levers table the model can cost (CUDA graphs, the batch
budget, an fp8 KV cache; tensor parallel where one GPU is too small or two may be cheaper), each ranked by
its predicted cost per million output tokens at the SLO: the capacity (the most concurrent requests
whose TPOT and TTFT meet it, `analysis.perfmodel`) at the committed, dated price of one such GPU
(data/prices.yaml). Then the study that would confirm the top choices: a params file per GPU (host local,
the choices as configurations), validated, with its predicted wall time and GPU cost.

`servelab predict --model DIR --compare-gpus` prints it. Not for the model's arithmetic
(`analysis.perfmodel`) nor for running anything (`pipeline`)."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from . import yamlio

from .analysis.calibration import gpu_machine
from .analysis.perfmodel import predict
from .analysis.roofline import HARDWARE
from .engines import get as profile
from .prices import load_table
from .schema import load_study
from .tables import DATA

#: a vLLM 0.26 engine's start with dummy weights and CUDA graphs: the published H200 studies' starts (2026-11-30
#: to 12-03, run.json server.startup_s) were 50-251 s, 190-250 s for most; a planned study counts this much
ENGINE_START_S = 210.0
#: the flags of data/levers.yaml the model can cost, and the values a plan tries (the first: the engine's default)
COSTED = {"enforce-eager": [False, True], "kv-cache-dtype": ["auto", "fp8"], "max-num-batched-tokens": [None, 2048]}
GPU_MEMORY_UTILIZATION = 0.9


@dataclass
class Choice:
    """One GPU and flag set, its predicted capacity at the SLO and what it costs."""

    gpu: str
    tp: int
    flags: dict[str, Any]
    kind: str
    capacity_rps: float
    concurrency: int | None
    output_tps: float
    tpot_s: float
    ttft_s: float
    usd_per_gpu_hour: float | None
    price_source: str
    how: str
    pred: dict[str, Any] = field(repr=False, default_factory=dict)
    #: other values of the levers that predicted the same (within 0.5 %)
    no_effect: list[str] = field(default_factory=list)

    @property
    def usd_per_m_output(self) -> float:
        if not self.usd_per_gpu_hour or not self.output_tps:
            return math.nan
        return self.usd_per_gpu_hour * self.tp / (self.output_tps * 3600.0) * 1e6

    def label(self) -> str:
        bits = [f"TP={self.tp}"] + [f"{k}={v}" for k, v in self.flags.items() if v not in (None, False, "auto")]
        return ", ".join(bits)


def levers() -> list[str]:
    """The flags of data/levers.yaml that the model can cost (the rest, e.g. speculative decoding, it cannot)."""
    table = yamlio.safe_load((DATA / "levers.yaml").read_text(encoding="utf-8"))
    return [lv["flag"] for lv in table.get("levers") or [] if lv["flag"] in COSTED]


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", str(s).lower()).split())


def gpu_prices(table: dict[str, Any] | None = None) -> dict[str, tuple[float, str]]:
    """USD per GPU-hour of each hardware row from the committed price table: the instance types whose GPU it is,
    the cheapest per GPU, with the instance, status, source and date; a GPU without a priced row is absent."""
    rows = (table or load_table()).get("ec2_on_demand") or []
    out: dict[str, tuple[float, str]] = {}
    for hw in HARDWARE:
        keys = [_norm(a) for a in hw["aliases"]] + [_norm(hw["name"])]
        best = None
        for r in rows:
            g = _norm(r.get("gpu", ""))
            if r.get("usd_per_hour") is None or not any(k and (k in g or g in k) for k in keys if len(k) >= 4):
                continue
            per = float(r["usd_per_hour"]) / float(r.get("gpus") or 1)
            if best is None or per < best[0]:
                best = (per, f"{r['instance_type']} {r['region']} ${float(r['usd_per_hour']):,.4g}/h for {r.get('gpus')} GPU(s) "
                              f"({r.get('status')}, as of {r.get('as_of')}; data/prices.yaml)")
        if best:
            out[hw["name"]] = best
    return out


def _tps(facts: dict[str, Any], memory_bytes: float) -> list[int]:
    """Tensor-parallel sizes worth pricing: the smallest whose GPUs hold the weights in their memory share with a
    tenth of it left for the KV cache, and twice it."""
    need = float(facts["weight_bytes"]) / (GPU_MEMORY_UTILIZATION * float(memory_bytes) * 0.9)
    first = next((t for t in (1, 2, 4, 8) if t >= need), None)
    return [t for t in (first, (first or 0) * 2) if t and t <= 8]


def compare(facts: dict[str, Any], *, engine: str = "vllm", input_tokens: int, output_tokens: int,
            slo: dict[str, float], gpus: Sequence[str] | None = None, base_args: dict[str, Any] | None = None,
            ties: str | None = None) -> list[Choice]:
    """Every GPU x lever choice with its capacity at the SLO and cost per million output tokens, cheapest first
    (choices without a price or a capacity last)."""
    prices = gpu_prices()
    prof = profile(engine)
    out = []
    for hw in HARDWARE:
        if gpus and hw["name"] not in gpus:
            continue
        m, why = gpu_machine(hw["name"])
        if m is None:
            continue
        price, src = prices.get(hw["name"], (None, "no price for this GPU in data/prices.yaml"))
        how = f"terms carried from {m.transferred_from}" if m.transferred_from else f"calibration {m.entry['id']}"
        names = levers()
        for tp in _tps(facts, m.memory_bytes or hw["memory_bytes"]):
            for values in itertools.product(*(COSTED[n] for n in names)):
                flags = dict(zip(names, values))
                args = {**(base_args or {}), "gpu-memory-utilization": GPU_MEMORY_UTILIZATION,
                        **{k: v for k, v in flags.items() if v not in (None, False, "auto")}}
                if tp > 1:
                    args["tensor-parallel-size"] = tp
                p = predict(facts, engine, args, m, input_tokens=input_tokens, output_tokens=output_tokens,
                            concurrency=[1], slo=slo, layout=prof.layout(args), band=False, ties=ties,
                            identical=bool(ties), waves=False)
                c = p.get("capacity_concurrency")
                rps = float(p.get("capacity_rps") or 0.0)
                rps = rps if rps == rps else 0.0
                tpot_c = p.get("capacity_tpot_s") or p["c1_tpot_s"]
                ch = Choice(hw["name"], tp, flags, p["kinds"]["capacity_rps"], rps, c, rps * output_tokens,
                            tpot_c, p["ttft_c1_s"], price, src, how, p)
                same = next((o for o in out if o.gpu == ch.gpu and o.tp == tp and o.output_tps > 0
                             and abs(o.output_tps - ch.output_tps) <= 0.005 * o.output_tps), None)
                if same is not None:  # a lever that changes nothing the model sees: said once, not ranked twice
                    same.no_effect.extend(x for x in (f"{k}={v}" for k, v in flags.items() if same.flags.get(k) != v)
                                          if x not in same.no_effect)
                    continue
                out.append(ch)
    # priced first; of those, estimates before bounds: a bound is what the GPU could do at best (no all-reduce, no
    # calibration), so a cheaper bound is no reason to rent before a dearer estimate; then by cost
    return sorted(out, key=lambda x: (not (x.usd_per_m_output == x.usd_per_m_output), x.kind != "estimate",
                                      x.usd_per_m_output if x.usd_per_m_output == x.usd_per_m_output else 0.0,
                                      -x.output_tps))


def study_for(choices: Sequence[Choice], *, model: dict[str, Any], load_format: str | None, input_tokens: int,
              output_tokens: int, slo: dict[str, float], name: str) -> tuple[dict[str, Any], float]:
    """A params file confirming `choices` (one GPU kind): each a configuration of the same workload (c=1, half the
    predicted capacity and the capacity, one warm-up and two rounds), host local; and its predicted wall time:
    every engine start (`ENGINE_START_S`) plus every level's rounds at its predicted TTFT + output x TPOT."""
    first = choices[0]
    conc = sorted({1, max(1, (first.concurrency or 1) // 2), max(1, first.concurrency or 1)})
    confs, wall = [], 0.0
    for i, ch in enumerate(choices):
        args = {k: v for k, v in ch.flags.items() if v not in (None, False, "auto")}
        if ch.tp > 1:
            args["tensor-parallel-size"] = ch.tp
        confs.append({"id": f"choice-{i + 1}", "label": f"{ch.gpu}, {ch.label()} (predicted "
                      f"${ch.usd_per_m_output:,.3g} per million output tokens at the SLO)", "engine": {"args": args}})
        wall += ENGINE_START_S
        for c in conc:
            t = ch.pred["tpot_s"].get(str(c)) or ch.tpot_s
            wall += 3 * (ch.ttft_s + output_tokens * t)  # one warm-up and two measured rounds
    study = {
        "study": name,
        "title": f"Confirming the predicted cheapest set-ups on {first.gpu} ({len(choices)} configurations)",
        "description": ("Written by `servelab predict --compare-gpus`: the set-ups the performance model ranked "
                        "cheapest per million output tokens at the SLO on this GPU, each a configuration, measured at "
                        "one request, half the predicted capacity and the capacity."),
        "engine": {"kind": "vllm", "model": model, **({"load_format": load_format} if load_format else {}),
                   "args": {"max-model-len": max(4096, input_tokens + output_tokens),
                            "gpu-memory-utilization": GPU_MEMORY_UTILIZATION}},
        "workload": {"api": "chat", "buckets": [{"input_tokens": input_tokens, "output_tokens": output_tokens}],
                     "concurrency": conc, "warmup_rounds": 1, "rounds": 2, "temperature": 1.0, "seed": None},
        "slo": {"ttft_p95_s": slo["ttft_p95_s"], "tpot_p95_s": slo["tpot_p95_s"]},
        "design": {"interleave": "off"},
        "quality": {"enabled": load_format != "dummy"},
        "configurations": confs,
    }
    return study, wall


def write_study(study: dict[str, Any], path: Path) -> Path:
    """Write a params file and validate it (`schema.load_study`): a plan never writes one that would not run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(json.loads(json.dumps(study)), sort_keys=False, width=120), encoding="utf-8")
    load_study(path)
    return path


def slug(s: str) -> str:
    return "-".join(_norm(s).split())


__all__ = ["COSTED", "ENGINE_START_S", "Choice", "compare", "gpu_prices", "levers", "slug", "study_for", "write_study"]
