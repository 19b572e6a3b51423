"""Predictions for a GPU servelab never calibrated, written before any measurement they are compared with:
every configuration of params/h100-holdout.yaml on one H100 (vLLM 0.26.0, dummy weights), by the committed
performance model (analysis/perfmodel.py) from the committed H200 calibration carried to the H100 by the
datasheets (analysis/transfer.py). The file names the git commit of the model it ran and every term it carried.

    .venv/bin/python benchmarks/h100_predictions.py [--out benchmarks/results/h100-predictions-<date>.json]

For each configuration: c=1 and c=32 TPOT at 256 + 256 tokens and c=1 TTFT at 256 and 2,048 prompt tokens, each
with its kind (estimate or bound) and band; for a MoE shape whose router ties under dummy weights, the c=32
TPOT a spread router would give beside it (what real weights would do). `--compare` holds an earlier file
against measured figures (a JSON of {config: {quantity: seconds}}) and prints the errors; nothing is fitted.

`--smoke DIR` (make test runs it): the same predictions into DIR/h100-predictions.json, and the committed file held
against the committed measured figures (issue #59's), printed.

Not a test: the record the hold-out is judged by (docs/predictions.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

GPUS = {"h100": {"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB"},  # nvidia-smi's name and memory
        "h200": {"name": "NVIDIA H200", "memory": "143771 MiB"}}
GPU = dict(GPUS["h100"])
HOST_PROBE: dict = {}  # --host-probe: the runner's probe of the host (measure.hostprobe), as a run record carries it
VERSION = "0.26.0"
QUANTITIES = ("tpot_c1_s", "tpot_c32_s", "ttft_256_s", "ttft_2048_s")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _run_record(study, cid: str, ties_off: bool = False) -> dict:
    from servelab.models.facts import facts_from_config
    from servelab.models.presets import PRESET_TOKENIZER_VOCAB_SIZE, PRESETS

    eng = study.engine_for(cid)
    preset = eng.model["preset"] if isinstance(eng.model, dict) else eng.model.preset
    cfg = dict(PRESETS[preset])
    cfg["vocab_size"] = PRESET_TOKENIZER_VOCAB_SIZE[preset]  # the preset's directory: its tokenizer's vocabulary
    cfg["pad_token_id"] = None  # the directory's is its tokenizer's (a config's default, e.g. Phi-3's, may not fit)
    facts = facts_from_config(cfg)
    ep = eng.model_dump()
    if ties_off:
        ep["load_format"] = "auto"  # real weights: the router spreads
    return {"study": study.study, "config": cid, "engine_params": ep, "gpus_used": [GPU], "host_probe": HOST_PROBE or None,
            "model": {"facts": facts, "config": cfg}, "server": {"version": VERSION}, "preset": preset}


def predict_all(params: Path) -> dict:
    from servelab.analysis.perfmodel import MODEL_VERSION, predict_configuration
    from servelab.schema import load_study

    study = load_study(params)
    out = {}
    for c in study.configurations:
        wl = study.workload_for(c.id)
        lengths = {b.label: (b.input_tokens, b.output_tokens) for b in wl.buckets}
        rec = _run_record(study, c.id)
        pred = predict_configuration(rec, wl, study.slo.model_dump(), lengths, time.strftime("%Y-%m-%dT%H:%M:%SZ"))
        b = pred["buckets"]
        dec = b.get("in256-out256") or b.get("in256-out64") or {}
        pre = b.get("in2048-out8") or {}
        row = {"preset": rec["preset"], "architecture": rec["model"]["facts"].get("architecture"),
               "router_ties": next((i["source"] for i in dec.get("inputs", []) if i["name"].startswith("identical")
                                    and i["value"] and "dummy" in str(i["source"])), None),
               "tpot_c1_s": dec.get("tpot_s", {}).get("1"), "tpot_c32_s": dec.get("tpot_s", {}).get("32"),
               "ttft_256_s": dec.get("ttft_c1_s"), "ttft_2048_s": pre.get("ttft_c1_s"),
               "kinds": {"tpot": (dec.get("kinds") or {}).get("tpot_s"), "ttft": (dec.get("kinds") or {}).get("ttft_c1_s")},
               "band": {"tpot_c1_s": (dec.get("band") or {}).get("tpot_s", {}).get("1"),
                        "tpot_c32_s": (dec.get("band") or {}).get("tpot_s", {}).get("32"),
                        "ttft_256_s": (dec.get("band") or {}).get("ttft_c1_s"),
                        "ttft_2048_s": (pre.get("band") or {}).get("ttft_c1_s")},
               "prefill_256": next((i["value"] for i in dec.get("inputs", []) if i["name"] == "prefill steps"), None),
               "prefill_2048": next((i["value"] for i in pre.get("inputs", []) if i["name"] == "prefill steps"), None),
               "bound_because": dec.get("bound_because"), "ttft_bound_because": dec.get("ttft_bound_because")}
        for label, bp in b.items():  # a TTFT sweep (prompts of several lengths at c=1): each length's TTFT and band
            if label not in ("in256-out256", "in2048-out8") and bp.get("ttft_c1_s") is not None:
                n = label.split("-")[0][2:]
                row[f"ttft_{n}_s"] = bp["ttft_c1_s"]
                row["band"][f"ttft_{n}_s"] = (bp.get("band") or {}).get("ttft_c1_s")
        if row["router_ties"]:  # what a spread router (real weights) would give at 32 requests
            spread = predict_configuration(_run_record(study, c.id, ties_off=True), wl, study.slo.model_dump(), lengths,
                                           "now")["buckets"]
            sd = spread.get("in256-out256") or spread.get("in256-out64") or {}
            row["spread_router"] = {"tpot_c32_s": sd.get("tpot_s", {}).get("32"),
                                    "band_c32": (sd.get("band") or {}).get("tpot_s", {}).get("32"),
                                    "ttft_256_s": sd.get("ttft_c1_s")}
        out[c.id] = row
    machine = pred.get("machine") or {}
    return {"format_version": 1, "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model_commit": _git("rev-parse", "HEAD"), "model_tree_clean": _git("status", "--porcelain", "lib") == "",
            "model_version": MODEL_VERSION, "params": str(params.relative_to(ROOT)), "gpu": GPU, "engine": f"vllm {VERSION}",
            "calibration": machine.get("transferred_from") or machine.get("calibration"), "host": machine.get("host"),
            "transfer": machine.get("transfer"), "configurations": out}


def compare(pred_file: Path, measured_file: Path) -> list[dict]:
    """Every predicted quantity against a measured one: error = (measured - predicted) / predicted."""
    pred = json.loads(pred_file.read_text())["configurations"]
    meas = json.loads(measured_file.read_text())
    rows = []
    for cid, m in meas.items():
        if cid.startswith("_"):
            continue
        p = pred.get(cid) or {}
        for q, v in m.items():
            if not (q in QUANTITIES or (q.startswith("ttft_") and q.endswith("_s"))) or v is None:
                continue
            key = q
            got = p.get(q)
            spread = (p.get("spread_router") or {}).get(q) if q == "tpot_c32_s" else None
            rows.append({"config": cid, "quantity": key, "measured_s": v, "predicted_s": got,
                         "error_pct": (v - got) / got * 100 if got else None, "band_s": (p.get("band") or {}).get(q),
                         "spread_router_s": spread,
                         "spread_error_pct": (v - spread) / spread * 100 if spread else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default=str(ROOT / "params" / "h100-holdout.yaml"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"h100-predictions-{time.strftime('%Y-%m-%d')}.json"))
    ap.add_argument("--compare", nargs=2, metavar=("PREDICTIONS", "MEASURED"),
                    help="hold an earlier predictions file against measured figures; print the errors")
    ap.add_argument("--host-probe", type=float, metavar="SECONDS",
                    help="predict for a host whose eager kernel launch took this long (the runner's probe); default: "
                         "before you rent, the typical host of those seen")
    ap.add_argument("--gpu", choices=sorted(GPUS), default="h100", help="the GPU predicted for (nvidia-smi's name)")
    ap.add_argument("--smoke", type=Path, metavar="DIR", help="predict into DIR and compare the committed files")
    a = ap.parse_args()
    GPU.update(GPUS[a.gpu])
    if a.host_probe:
        HOST_PROBE["launch_eager_s"] = a.host_probe
    if a.smoke:
        a.out = str(a.smoke / "h100-predictions.json")
        res = ROOT / "benchmarks" / "results"
        a.compare = None
        for r in compare(res / "h100-predictions-2026-12-06.json", res / "h100-issue59-measured.json"):
            print(f"committed: {r['config']} {r['quantity']} {r['error_pct']:+.0f} %")
    if a.compare:
        for r in compare(Path(a.compare[0]), Path(a.compare[1])):
            sp = f"  (spread router {r['spread_router_s'] * 1e3:.2f} ms: {r['spread_error_pct']:+.0f} %)" \
                if r["spread_router_s"] else ""
            print(f"{r['config']:14} {r['quantity']:12} measured {r['measured_s'] * 1e3:7.2f} ms  predicted "
                  f"{r['predicted_s'] * 1e3:7.2f} ms  {r['error_pct']:+5.0f} %{sp}")
        return
    res = predict_all(Path(a.params).resolve())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"model {res['model_commit'][:10]} ({res['model_version']}), calibration {res['calibration']} carried to "
          f"{GPU['name']}")
    for cid, r in res["configurations"].items():
        b = r["band"]

        def f(q: str) -> str:
            v, bb = r.get(q), b.get(q)
            if v is None:
                return "-"
            return f"{v * 1e3:.2f}" + (f" ({bb[0] * 1e3:.2f}-{bb[1] * 1e3:.2f})" if bb else "")
        extra = f"; spread router c=32 {r['spread_router']['tpot_c32_s'] * 1e3:.2f}" if r.get("spread_router") else ""
        sweep = "".join(f", {q[5:-2]} {f(q)}" for q in r if q.startswith("ttft_") and q.endswith("_s") and q not in ("ttft_256_s", "ttft_2048_s"))
        print(f"{cid:20} TPOT c=1 {f('tpot_c1_s')}, c=32 {f('tpot_c32_s')}; TTFT 256 {f('ttft_256_s')}{sweep}, "
              f"2048 {f('ttft_2048_s')} ms ({r['kinds']['tpot']}/{r['kinds']['ttft']}){extra}")


if __name__ == "__main__":
    main()
