"""`servelab capacity URL`: the capacity-at-SLO search against any OpenAI-compatible server.

Parses the options into a search spec, SLO targets and a trial shape, prints the worst-case
cost first (`--dry-run` stops there), runs `measure.capacity.run_capacity` into a run folder and
prints its one-line answer. Not for logic: the search lives in `measure.slo_search`. `servelab --help`
imports this module: what loads pandas (the run folder, the client) is imported in `cmd_capacity`.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from .measure.slo_search import SearchSpec, Targets
from .schema import AttachParams, Bucket, Workload

EXIT_FAIL = 1


def spec_from_args(a: argparse.Namespace):  # -> (SearchSpec, Targets, TrialShape)
    from .measure.capacity import TrialShape

    if a.slo_ttft_p95_s is None and a.slo_tpot_p95_s is None:
        raise ValueError("give an SLO: --slo-ttft-p95-s and/or --slo-tpot-p95-s")
    start = a.start if a.start is not None else (1.0 if a.axis == "rate" else 1)
    spec = SearchSpec(axis=a.axis, start=start, min_load=a.min if a.min is not None else (0.125 if a.axis == "rate" else 1),
                      max_load=a.max, precision=a.precision, repeats=a.repeats, max_repeats=max(a.repeats, a.max_repeats),
                      max_trials=a.max_trials)
    targets = Targets(a.slo_ttft_p95_s, a.slo_tpot_p95_s, a.slo_error_rate)
    shape = TrialShape(duration_s=a.duration, warmup_rounds=a.warmup, rounds=a.rounds,
                       requests_per_round=a.requests_per_round, ramp=not a.no_ramp)
    return spec, targets, shape


def cmd_capacity(a: argparse.Namespace) -> int:
    from .hosts.attach import attach
    from .measure.capacity import run_capacity, worst_case, worst_case_line
    from .measure.runinfo import base_record

    spec, targets, shape = spec_from_args(a)
    print(worst_case_line(worst_case(spec, shape)) + f"; budget {a.budget_s:.0f} s" if a.budget_s else
          worst_case_line(worst_case(spec, shape)))
    if a.dry_run:
        return 0
    headers = {k.strip(): v.strip() for k, v in (h.split(":", 1) for h in a.header or [])}
    srv = attach(AttachParams(url=a.url, model=a.model, headers=headers, api_key_env=a.api_key_env,
                              tokenizer=a.tokenizer))
    wl = Workload(api=a.api, buckets=[Bucket(input_tokens=a.input, output_tokens=a.output)], concurrency=[1],
                  arrival=a.arrival, rates_rps=[1.0], timeout_s=a.timeout, max_in_flight=a.max_in_flight,
                  metrics_interval_s=a.metrics_interval)
    out = Path(a.out or Path("runs") / "capacity" / datetime.now().strftime("%Y%m%d-%H%M%S"))
    res = run_capacity(srv, wl, out, spec, targets, shape=shape, study="capacity", config_id=out.name,
                       record=base_record("capacity", out.name), budget_s=a.budget_s, resume=a.resume,
                       progress=False)
    print(res.line)
    print(f"trials: {out}/records.jsonl, levels.jsonl; result in {out}/run.json (capacity), status {res.status}")
    if res.message:
        print(res.message, file=sys.stderr)
    return 0 if res.status == "complete" else EXIT_FAIL


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("capacity", help="highest load meeting an SLO on a running OpenAI-compatible server")
    c.add_argument("url")
    c.add_argument("--model")
    c.add_argument("--api", choices=["chat", "completions"], default="chat")
    c.add_argument("--input", type=int, default=256, help="prompt tokens")
    c.add_argument("--output", type=int, default=128, help="output tokens per request")
    c.add_argument("--slo-ttft-p95-s", type=float, help="p95 TTFT target (s)")
    c.add_argument("--slo-tpot-p95-s", type=float, help="p95 time per output token target (s)")
    c.add_argument("--slo-error-rate", type=float, default=0.01, help="highest acceptable failed share")
    c.add_argument("--axis", choices=["rate", "concurrency"], default="rate",
                   help="rate: open-loop requests/s; concurrency: closed-loop in-flight requests")
    c.add_argument("--arrival", choices=["constant", "poisson"], default="poisson", help="open-loop arrivals")
    c.add_argument("--start", type=float, help="first load (default 1)")
    c.add_argument("--min", type=float, help="lowest load searched")
    c.add_argument("--max", type=float, default=256.0, help="highest load searched")
    c.add_argument("--precision", type=float, default=0.1, help="stop when the bracket is this share of its low end")
    c.add_argument("--repeats", type=int, default=2,
                   help="trials at least at each end of the bracket (the later ones after the bisection)")
    c.add_argument("--max-repeats", type=int, default=4,
                   help="at most this many trials pooled at one load (a p95 pass needs >= 59 requests)")
    c.add_argument("--max-trials", type=int, default=24)
    c.add_argument("--duration", type=float, default=10.0, help="open loop: seconds of arrivals per trial round")
    c.add_argument("--warmup", type=int, default=0, help="warmup rounds per trial")
    c.add_argument("--rounds", type=int, default=1, help="measured rounds per trial")
    c.add_argument("--requests-per-round", type=int, default=4, help="closed loop: multiple of the concurrency")
    c.add_argument("--no-ramp", action="store_true",
                   help="closed loop: start every worker at once (the requests then run in step, as one wave)")
    c.add_argument("--max-in-flight", type=int, default=1024, help="open loop: cap on concurrent requests")
    c.add_argument("--timeout", type=float, default=300.0, help="per-request deadline (s)")
    c.add_argument("--metrics-interval", type=float, default=0.5, help="/metrics sampling period (0 = off)")
    c.add_argument("--budget-s", type=float, help="stop before a trial would pass this many seconds")
    c.add_argument("--resume", action="store_true", help="continue the search in --out from its finished trials")
    c.add_argument("--dry-run", action="store_true", help="print the worst-case cost, run nothing")
    c.add_argument("--header", action="append", help="extra header 'Name: value' (repeatable)")
    c.add_argument("--api-key-env", help="environment variable holding the API key")
    c.add_argument("--tokenizer", help="local tokenizer dir when the server has no /tokenize")
    c.add_argument("--out", help="run folder (default runs/capacity/<timestamp>)")
    c.set_defaults(fn=cmd_capacity)
