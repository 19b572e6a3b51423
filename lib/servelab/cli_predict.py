"""`servelab calibrate-hw` (measure this machine for the performance model), `servelab predict
PARAMS` (what a study's configurations should do on a machine) and `servelab predict --model
DIR_OR_CONFIG_JSON --gpu NAME` (what one model would do, without a params file): the "before I rent"
answer, before renting or running anything. The commands' words only: `calibrate_hw`,
`models.facts` and `analysis.perfmodel` do the work. Not for running studies (`pipeline`). `servelab --help`
imports this module: the heavy ones (calibrate_hw, forecast, analysis) are imported where a command calls them."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError
from .models.facts import facts_from_config, kv_bytes_per_token
from .schema import load_study
from .schema.parts import Workload


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def cmd_calibrate_hw(a: argparse.Namespace) -> int:
    from . import calibrate_fit
    from .calibrate_hw import calibrate_collectives, calibrate_hw

    if a.collectives:
        calibrate_collectives(a.add_to)
        return 0
    fits = (("ttft_from", "--ttft-from STUDY_DIR ...", calibrate_fit.ttft_from),
            ("hosts_from", "--hosts-from STUDY_DIR ...", calibrate_fit.hosts_from),
            ("moe_prefill_from", "--moe-prefill-from STUDY_DIR", calibrate_fit.moe_prefill_from),
            ("mla_prefill_from", "--mla-prefill-from STUDY_DIR ...", calibrate_fit.mla_prefill_from))
    for attr, usage, fit in fits:  # terms fitted on published studies: they measure nothing
        if getattr(a, attr):
            if not a.add_to:
                raise UserError(f"calibrate-hw {usage} needs --add-to ID (the entry it goes into)")
            fit(getattr(a, attr), a.add_to, a.engine)
            return 0

    return calibrate_hw(engine=a.engine, kinds=_csv(a.kinds) if a.kinds else None,
                        widths=[int(x) for x in _csv(a.widths)] if a.widths else None,
                        layers=[int(x) for x in _csv(a.layers)] if a.layers else None,
                        modes=_csv(a.modes) if a.modes else None, out=a.out, cal_id=a.id, micro_only=a.micro_only,
                        concurrent=a.concurrent, port_base=a.port_base, quick=a.quick,
                        add_to=a.add_to)


def cmd_predict(a: argparse.Namespace) -> int:
    if (a.params is None) == (a.model is None):
        raise UserError("give a params file or --model DIR_OR_CONFIG_JSON (one of them)")
    if a.model is not None:
        return predict_model(a)
    if a.hardware is None and a.gpu is not None:
        a.hardware = a.gpu
    from .forecast import prediction_lines, prediction_machine

    study = load_study(a.params)
    machine, where = prediction_machine(study, a.hardware)
    ids = a.config or [c.id for c in study.configurations]
    unknown = sorted(set(ids) - {c.id for c in study.configurations})
    if unknown:
        raise UserError(f"{a.params}: no configuration {', '.join(unknown)}")
    print(f"{study.study}: predicted on {where}, before any request (servelab's performance model)")
    for cid in ids:
        print("\n".join(prediction_lines(study, cid, machine)))
    return 0


def _model_config(path: str) -> tuple[dict[str, Any], str]:
    """config.json of a model directory (or the file itself) and the model's name."""
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise UserError(f"--model {path}: no config.json there")
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"--model {path}: {f} is not a JSON file ({e})") from None
    return cfg, (p.name if p.is_dir() else f.parent.name if f.name == "config.json" else f.stem)


def _gpu_record(gpu: str | None) -> tuple[dict[str, Any], str]:
    """The run record's GPU for a prediction and how the figures are got: a calibration entry of that
    GPU (estimates), the nearest calibrated GPU's terms carried to it by the datasheets (estimates with a
    wider band), else its datasheet row (bounds); the newest calibrated GPU when none is named."""
    from .analysis.calibration import calibrations, gpu_machine
    from .analysis.roofline import get_hardware

    if gpu is None:
        gpus = [c for c in calibrations() if c["machine"]["kind"] == "gpu"]
        if not gpus:
            raise UserError("no GPU calibration entry (data/calibrations/): give --gpu")
        gpu = gpus[-1]["machine"]["name"]
    m, why = gpu_machine(gpu)
    if m is not None:
        mem = m.memory_bytes
        how = (f"terms carried from calibration {m.transferred_from} by the datasheets (estimates, with a band)"
               if m.transferred_from else f"calibration {m.entry['id']}")
        return {"name": gpu, "memory": f"{mem / 2**20:.0f} MiB" if mem else ""}, how
    try:
        hw = get_hardware(gpu)
    except KeyError as e:
        raise UserError(f"--gpu {gpu}: no calibration entry and no datasheet row ({e.args[0]})") from None
    return ({"name": gpu, "memory": f"{hw['memory_bytes'] / 2**20:.0f} MiB" if hw.get("memory_bytes") else ""},
            f"datasheet {hw['name']} (as of {hw.get('as_of')}): bounds ({why})")


def predict_model(a: argparse.Namespace) -> int:
    """`servelab predict --model`: the facts, then the model's figures for one request shape."""
    from .analysis.perfmodel import predict_configuration
    from .engines import get as profile  # httpx and prometheus_client: only this command's path needs them
    from .engines.flags import get_flag

    cfg, name = _model_config(a.model)
    facts = facts_from_config(cfg)
    prof = profile(a.engine)
    args: dict[str, Any] = {}
    for kv in a.arg:
        k, sep, v = kv.partition("=")
        if not sep:
            raise UserError(f"--arg {kv}: expected FLAG=VALUE")
        args[k.strip().lstrip("-")] = yaml_scalar(v)
    if a.kv_cache_dtype not in (None, "auto"):
        args["kv-cache-dtype"] = a.kv_cache_dtype
    if a.tp > 1:
        args["tensor-parallel-size" if "tensor-parallel-size" in prof.known_flags() else "tp-size"] = a.tp
    problems = prof.validate_args(dict(args))
    if problems:
        raise UserError(f"--arg: {'; '.join(problems)}")
    if a.compare_gpus:
        return compare_gpus(a, name, facts, cfg, args)
    gpu, how = _gpu_record(a.gpu)
    conc = sorted({int(x) for x in _csv(a.concurrency)} | {1})
    wl = Workload.model_validate({"buckets": [{"input_tokens": a.input, "output_tokens": a.output}],
                                  "concurrency": conc, "temperature": 0.0 if a.identical else 1.0,
                                  "seed": 42 if a.identical else None})
    run = {"study": "predict", "config": name, "gpus_used": [gpu], "engine_params": {"kind": a.engine, "args": args},
           "model": {"facts": facts, "config": cfg}}
    slo = {"ttft_p95_s": a.ttft_slo, "tpot_p95_s": a.tpot_slo}
    label = f"in{a.input}-out{a.output}"
    pred = predict_configuration(run, wl, slo, {label: (a.input, a.output)}, "now")
    _print_model(name, facts, a, gpu, how, pred, label, get_flag(args, "kv-cache-dtype") or "auto")
    return 0


def cmd_routing(a: argparse.Namespace) -> int:
    """`servelab routing PARAMS --config ID`: ask a configuration's running engine (started with
    --enable-return-routed-experts) which experts its router chose for `--concurrency` requests decoded together,
    and write routing.json (distinct experts per layer per decode step, beside spread routing's expectation) into
    --out, where the report's physics check reads it (`analysis.physics`)."""
    import time

    import httpx

    from .analysis.routing import decode_routed, distinct_per_step, routing_record
    from .hosts.local import model_dir_for
    from .measure.routing import filler, probe
    from .models import model_facts
    from .runfolder import ROUTING_JSON, write_json

    study = load_study(a.params)
    if a.config not in {c.id for c in study.configurations}:
        raise UserError(f"{a.params}: no configuration {a.config}")
    eng = study.engine_for(a.config)
    url = a.url or f"http://{eng.host}:{eng.port}"
    try:
        model = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]["id"]
        answers = probe(url, model, concurrency=a.concurrency, prompt_text=filler(a.input), output=a.output)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise UserError(f"servelab routing {url}: {type(e).__name__}: {e}") from None
    got = distinct_per_step([decode_routed(x["routed_experts"]) for x in answers], [x["prompt_tokens"] for x in answers])
    facts = model_facts(model_dir_for(eng))
    rec = routing_record(got, facts, concurrency=a.concurrency,
                         source=f"{eng.kind} --enable-return-routed-experts at {url}, {a.concurrency} requests of "
                                f"{a.input} words + {a.output} tokens, {time.strftime('%Y-%m-%d', time.gmtime())}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / ROUTING_JSON, rec)
    print(f"{a.config}: {rec['distinct_per_step']:.1f} distinct experts per layer per decode step over {got['steps']} "
          f"steps of {a.concurrency} requests (spread routing: {rec['spread_per_step'] or 0:.1f}; every token the same: "
          f"{rec['tied_per_step']}) -> {out / ROUTING_JSON}")
    return 0


def _model_ref(path: str, facts: dict[str, Any], cfg: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The params file's model for `--model`: a model directory as it is (its weights); a config.json alone, the
    preset of the same shape (dummy weights), else its folder (which then needs a tokenizer)."""
    from .models.facts import facts_from_config
    from .models.presets import PRESETS

    p = Path(path)
    if p.is_dir():
        return {"path": str(p.resolve())}, None
    keys = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
    for name, pc in PRESETS.items():
        if not name.startswith("calib-") and all(pc.get(k) == cfg.get(k) for k in keys):
            try:
                if facts_from_config(pc).get("num_experts") == facts.get("num_experts"):
                    return {"preset": name}, "dummy"
            except Exception:  # noqa: BLE001 - a preset this transformers cannot build is no match
                continue
    return {"path": str(p.resolve().parent)}, None


def compare_gpus(a: argparse.Namespace, name: str, facts: dict[str, Any], cfg: dict[str, Any],
                 args: dict[str, Any]) -> int:
    """`servelab predict --model DIR --compare-gpus`: every GPU of the hardware table and every lever the model can
    cost, ranked by predicted cost per million output tokens at the SLO; the params files that would confirm the top
    choices, validated, with their predicted wall time and GPU cost."""
    from .advise import compare, levers, slug, study_for, write_study
    from .forecast import fmt_value as _fmt

    slo = {"ttft_p95_s": a.ttft_slo, "tpot_p95_s": a.tpot_slo}
    ch = compare(facts, engine=a.engine, input_tokens=a.input, output_tokens=a.output, slo=slo, base_args=args)
    print(f"{name}: {facts['architecture']}, {facts['param_count'] / 1e9:.2f} B parameters, "
          f"{facts['weight_bytes'] / 2**30:.1f} GiB; requests of {a.input} + {a.output} tokens; SLO p95 TTFT <= "
          f"{a.ttft_slo:g} s, TPOT <= {a.tpot_slo * 1000:g} ms; {a.engine}, levers {', '.join(levers())} and TP")
    print(f"{'rank':>4}  {'GPU':38} {'set-up':44} {'req/s':>7} {'c':>5} {'out tok/s':>9} {'TPOT ms':>7} "
          f"{'$/GPU-h':>7} {'$/M out':>8}  kind")
    ranked = list(enumerate(ch, 1))
    best_bounds = [(i, c) for i, c in ranked[a.top:] if c.kind != "estimate"
                   and c.usd_per_m_output == c.usd_per_m_output][:3]  # ranked after the estimates: still shown
    for i, c in ranked[:a.top] + best_bounds:
        if best_bounds and i == best_bounds[0][0]:
            print("   ...")
        print(f"{i:>4}  {c.gpu:38} {c.label():44} {_fmt(c.capacity_rps):>7} {str(c.concurrency):>5} "
              f"{_fmt(c.output_tps):>9} {_fmt(c.tpot_s, 1000):>7} {_fmt(c.usd_per_gpu_hour):>7} "
              f"{_fmt(c.usd_per_m_output):>8}  {c.kind}")
    for g in dict.fromkeys(c.gpu for c in ch):
        first = next(c for c in ch if c.gpu == g)
        print(f"  {g}: {first.how}; price {first.price_source}")
    same = sorted({x for c in ch[:a.top] for x in c.no_effect})
    if same:
        print(f"  no predicted effect (ranked once, at the default): {', '.join(same)}")
    print("  estimates carry the model's band (servelab predict --model --gpu) and rank before bounds, which say what a "
          "set-up could do at best (a TP > 1 row is a bound until the all-reduce is calibrated); speculative decoding "
          "is not costed")
    top = [c for c in ch if c.usd_per_m_output == c.usd_per_m_output][:3]
    model, load_format = _model_ref(a.model, facts, cfg)
    out_dir = Path(a.write_studies)
    for g in dict.fromkeys(c.gpu for c in top):
        picks = [c for c in ch if c.gpu == g and c.usd_per_m_output == c.usd_per_m_output][:3]
        sid = f"plan-{slug(name)}-{slug(g)}"
        study, wall = study_for(picks, model=model, load_format=load_format, input_tokens=a.input,
                                output_tokens=a.output, slo=slo, name=sid)
        path = write_study(study, out_dir / f"{sid}.yaml")
        gpus = max(c.tp for c in picks)
        cost = wall / 3600.0 * (picks[0].usd_per_gpu_hour or math.nan) * gpus
        print(f"confirm on {g}: {path} ({len(picks)} configurations; predicted {wall / 60:.0f} min on {gpus} GPU(s), "
              f"about ${cost:,.2f} at ${picks[0].usd_per_gpu_hour:,.2f}/GPU-h; validated)")
    return 0


def yaml_scalar(v: str) -> Any:
    return yaml.safe_load(v) if v.strip() else v


def _print_model(name: str, f: dict[str, Any], a: argparse.Namespace, gpu: dict[str, Any], how: str,
                 pred: dict[str, Any], label: str, kv_dtype: str) -> None:
    from .forecast import band_text, fmt_value as _fmt

    moe = (f"; {f['num_experts']} routed experts per MoE layer ({f['num_moe_layers']} of {f['num_layers']} layers), "
           f"{f['num_active_experts']} per token, {f['num_shared_experts']} shared; "
           f"{f['active_param_count'] / 1e9:.2f} B active") if f.get("num_experts") else ""
    print(f"{name}: {f['architecture']} ({f['model_type']}), {f['param_count'] / 1e9:.2f} B parameters{moe}")
    print(f"  facts: {f.get('facts_source')}")
    print(f"  on {gpu['name']} with {a.engine}, {a.tp} GPU(s): {how}")
    if pred.get("not_predictable"):
        print(f"  not predictable: {pred['not_predictable']}")
        return
    p = pred["buckets"][label]
    kinds = p.get("kinds") or {}
    q = f", {f['quantization']} experts" if f.get("quantization") else ""
    print(f"  weights: {f['weight_bytes'] / 2**30:.2f} GiB ({f['dtype']}{q}: every parameter counted)")
    layers = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in (f.get("kv_layers") or {}).items())
    print(f"  KV cache: {kv_bytes_per_token(f, kv_dtype, a.tp):,} bytes per token ({kv_dtype}; {layers}); "
          f"{_fmt(p['kv_tokens'])} tokens fit ({p['kv_from']}), {_fmt(p['kv_limited_concurrency'])} requests of "
          f"{a.input} + {a.output} tokens ({kinds.get('kv_limited_concurrency')})")
    band = p.get("band") or {}
    tp = ", ".join(f"c={c} {_fmt(v, 1000, ' ms')}{band_text(band.get('tpot_s', {}).get(c))}"
                   for c, v in sorted(p["tpot_s"].items(), key=lambda x: int(x[0])))
    print(f"  TPOT: {tp} ({kinds.get('tpot_s', 'bound')}; each request its own tokens unless --identical, a closed "
          "loop in waves)")
    print(f"  TTFT at c=1: {_fmt(p['ttft_c1_s'], 1000, ' ms')}{band_text(band.get('ttft_c1_s'))} "
          f"({kinds.get('ttft_c1_s', 'bound')})")
    print(f"  capacity at the SLO (p95 TTFT <= {a.ttft_slo:g} s, TPOT <= {a.tpot_slo * 1000:g} ms): "
          f"{_fmt(p.get('capacity_rps'))} req/s at c={p.get('capacity_concurrency')} (binding: "
          f"{p.get('capacity_binding')}; {kinds.get('capacity_rps', 'bound')})")
    for t in p.get("engine_terms") or []:
        print(f"  engine term {t['id']}: {_fmt(t['seconds'], 1000, ' ms')} per decode step ({t['source']})")
    for t in (pred.get("machine") or {}).get("transfer") or []:
        rng = f", +/-{t['range'] * 100:.0f} %" if t.get("range") else ""
        print(f"  carried: {t['term']}: {t['rule']} ({t['source']}{rng})")
    host = (pred.get("machine") or {}).get("host") or {}
    if host.get("how") in ("probe", "hosts seen"):
        print(f"  host: the engine's CPU-side terms x{host['factor']:.2f}: {host['source']}")
    if band:
        print(f"  band: {band.get('rule')}")
    for why in p.get("bound_because") or []:
        print(f"  bound: {why}")
    for why in p.get("ttft_bound_because") or []:
        print(f"  TTFT bound: {why}")


def add_parser(sub: Any) -> None:
    c = sub.add_parser("calibrate-hw", help="measure this machine for the performance model (data/calibrations/)")
    c.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    c.add_argument("--kinds", help="layer kinds: dense,moe,mla (default: all on a GPU, dense on a CPU)")
    c.add_argument("--widths", help="calibration widths (default 256 on a GPU; 256,1024 on a CPU)")
    c.add_argument("--layers", help="depths: 2,4,8 (the default), 16,32,64 (a GPU's deeper pass, with --add-to)")
    c.add_argument("--add-to", metavar="ID", help="pool this pass into the existing entry ID and fit it again")
    c.add_argument("--modes", help="graphs,eager (default: both on a GPU, eager on a CPU)")
    c.add_argument("--micro-only", action="store_true", help="the micro-benchmarks only, no engine")
    c.add_argument("--moe-prefill-from", metavar="STUDY_DIR",
                   help="fit the engine's MoE prefill term from a published TTFT sweep (MoE and dense shapes at "
                        "c=1, several prompt lengths) into the entry --add-to names; measures nothing")
    c.add_argument("--ttft-from", metavar="STUDY_DIR", nargs="+",
                   help="fit the engine's fixed cost of a request (HTTP, template, tokenization, scheduling) from "
                        "published studies' TTFTs at c=1 less the model's prefill, into the entry --add-to names; "
                        "measures nothing")
    c.add_argument("--mla-prefill-from", metavar="STUDY_DIR", nargs="+",
                   help="fit latent attention's host cost per layer inside a CUDA graph's prefill (vLLM runs each "
                        "layer's attention between the graph's pieces) from published studies' TTFTs at c=1 of a "
                        "latent-attention and a dense shape, into the entry --add-to names; measures nothing")
    c.add_argument("--hosts-from", metavar="STUDY_DIR", nargs="+",
                   help="fit each published study's host factor (its engine's CPU-side time over the calibration "
                        "host's, from its c=1 TTFTs and TPOTs) into the entry --add-to names (hosts_seen: before you "
                        "rent, predictions take the typical host and a band over them); measures nothing")
    c.add_argument("--collectives", action="store_true",
                   help="time all-reduce and all-to-all between this machine's GPUs (NCCL; 2 or more GPUs) for the "
                        "model's tensor- and expert-parallel terms, into the entry --add-to names (default: the newest "
                        "entry of this GPU); measures nothing else")
    c.add_argument("--concurrent", type=int, help="servers started at once (default: all on a GPU, 1 on a CPU)")
    c.add_argument("--port-base", type=int, default=8600)
    c.add_argument("--id", help="entry id (default <machine>-<date>)")
    c.add_argument("--out", help="entry file (default lib/servelab/data/calibrations/<id>.yaml)")
    c.add_argument("--quick", action="store_true", help="small buffers (a check of the procedure, not a calibration)")
    c.set_defaults(fn=cmd_calibrate_hw)

    p = sub.add_parser("predict", help="what a study's configurations (or one model) should do, before running anything")
    p.add_argument("params", nargs="?", help="a study's params file (or use --model)")
    p.add_argument("--config", action="append", help="only this configuration (repeatable)")
    p.add_argument("--hardware", help="a calibrated GPU's name (e.g. 'NVIDIA H200'), or cpu for this machine "
                                      "(default: the study's: a local study this CPU, a GPU study the newest GPU entry)")
    p.add_argument("--model", metavar="DIR_OR_CONFIG_JSON",
                   help="predict one model without a params file: a model directory or its config.json")
    p.add_argument("--gpu", help="with --model: a GPU with a calibration entry (an estimate) or a datasheet row "
                                 "(bounds), e.g. 'NVIDIA H200' (default: the newest calibrated GPU)")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm", help="with --model (default vllm)")
    p.add_argument("--input", type=int, default=256, help="with --model: prompt tokens (default 256)")
    p.add_argument("--output", type=int, default=256, help="with --model: output tokens (default 256)")
    p.add_argument("--concurrency", default="1,8,32", help="with --model: concurrent requests (default 1,8,32)")
    p.add_argument("--kv-cache-dtype", default="auto", help="with --model: auto (the model dtype) or fp8")
    p.add_argument("--tp", type=int, default=1, help="with --model: tensor-parallel GPUs (default 1)")
    p.add_argument("--arg", action="append", default=[], metavar="FLAG=VALUE",
                   help="with --model: another engine flag, e.g. gpu-memory-utilization=0.9 (repeatable)")
    p.add_argument("--ttft-slo", type=float, default=1.0, help="with --model: p95 TTFT target in s (default 1.0)")
    p.add_argument("--tpot-slo", type=float, default=0.05, help="with --model: p95 TPOT target in s (default 0.05)")
    p.add_argument("--compare-gpus", action="store_true",
                   help="with --model: every GPU of the hardware table and every lever of the levers table the model "
                        "can cost, ranked by predicted cost per million output tokens at the SLO; writes the params "
                        "files that would confirm the top choices (--write-studies)")
    p.add_argument("--top", type=int, default=12, help="with --compare-gpus: rows to print (default 12)")
    p.add_argument("--write-studies", default="runs/plans", metavar="DIR",
                   help="with --compare-gpus: where the confirming params files go (default runs/plans)")
    p.add_argument("--identical", action="store_true",
                   help="with --model: every request the same prompt decoded greedily (a MoE batch routes as one "
                        "token); default: each request its own tokens, as real traffic")
    p.set_defaults(fn=cmd_predict)

    r = sub.add_parser("routing", help="the experts a running MoE engine's decode steps touched (its own routing "
                                       "report), for the physics check")
    r.add_argument("params")
    r.add_argument("--config", required=True, help="the configuration whose engine is running (started with "
                                                    "enable-return-routed-experts)")
    r.add_argument("--url", help="the server (default: the configuration's engine host and port)")
    r.add_argument("--concurrency", type=int, default=32, help="requests decoded together (default 32)")
    r.add_argument("--input", type=int, default=256, help="prompt words per request (default 256)")
    r.add_argument("--output", type=int, default=64, help="tokens generated per request (default 64)")
    r.add_argument("--out", required=True, help="folder for routing.json: a published configuration's data folder, "
                                                "e.g. reports/STUDY/data/CONFIG")
    r.set_defaults(fn=cmd_routing)


__all__ = ["add_parser", "cmd_calibrate_hw", "cmd_predict", "cmd_routing"]
