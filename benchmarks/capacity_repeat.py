"""Back-to-back capacity searches on one server: do they give the same bracket every time, the first
search on a fresh engine included, and what did each cost (trials, requests, wall time)?

Starts one engine (the default study's eager SmolLM2 on vLLM CPU, `--max-num-seqs` as given) unless
a URL is given, then runs `servelab capacity` `--runs` times, each in its own folder, and prints one
line per search. `--lib DIR` runs another checkout's servelab (its `lib/`) for a before/after
comparison on the same server.

    .venv/bin/python benchmarks/capacity_repeat.py --runs 5 --out runs/capacity-repeat/after
    .venv/bin/python benchmarks/capacity_repeat.py --runs 5 --lib OLD_CHECKOUT/lib --out runs/capacity-repeat/before

Each search's capacity is also read off all its trials near the bracket at once (`slo_search.fitted`:
a line of each trial's log p95 against log load) with one-sided 95 % bounds; the summary says whether
one load lies within every search's bounds, and how far the searches' fits differ against their own
intervals (mean z^2 over pairs: about 1 when the intervals account for what differs between searches).
`--replay` recomputes that from finished searches' folders (the fit is a function of their trials).

    .venv/bin/python benchmarks/capacity_repeat.py --replay --out runs/capacity-repeat/trialunit

    .venv/bin/python benchmarks/capacity_repeat.py --smoke DIR      # two small searches, then the replay

Not a test: what one machine measured, written to OUT/repeat.json (OUT/fit.json with --replay).
`--smoke DIR` (make test runs it): the engine's params are planned but the engine is not started (its
model build and start take minutes); two small searches run against the reference server (2 slots, up
to 6 trials of at least 20 requests, so that each search's fit can be made), then `--replay` on them:
DIR/repeat.json and DIR/fit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ["--axis", "concurrency", "--input", "128", "--output", "32", "--slo-ttft-p95-s", "1.0",
          "--slo-tpot-p95-s", "0.1", "--max", "32"]
# --smoke: the reference server with 2 slots (a third stream waits a whole request) and a small search
# whose trials are large enough (>= 20 requests) to be fitted
SMOKE_SERVER = {"ttft_s": 0.002, "itl_s": 0.002, "slots": 2}
SMOKE_SEARCH = ["--axis", "concurrency", "--input", "16", "--output", "4", "--slo-ttft-p95-s", "0.006",
                "--slo-tpot-p95-s", "0.1", "--max", "4", "--max-trials", "6", "--rounds", "2",
                "--requests-per-round", "10"]


def engine_params(max_num_seqs: int, port: int):
    """The default study's eager engine (params/local-cpu.yaml) with `--max-num-seqs` and the port."""
    sys.path.insert(0, str(ROOT / "lib"))
    from servelab.plan import load_study_file, plan_study

    plan = plan_study(load_study_file(ROOT / "params" / "local-cpu.yaml"))["eager"]
    return plan.engine.model_copy(update={"port": port, "args": {**plan.engine.args, "max-num-seqs": max_num_seqs}})


def start_engine(max_num_seqs: int, port: int, workdir: Path):
    from servelab.hosts.local import model_dir_for
    from servelab.hosts.process import Engine

    eng = engine_params(max_num_seqs, port)
    e = Engine(eng, model_dir_for(eng), workdir)
    e.start()
    return e


def search(url: str, out: Path, lib: str | None, args: list[str] = SEARCH) -> dict:
    env = dict(os.environ)
    if lib:
        env["PYTHONPATH"] = lib
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "capacity", url, *args, "--out", str(out)],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    line = next((x for x in r.stdout.splitlines() if x.startswith("capacity at SLO:")), r.stderr.strip()[-300:])
    return {**row_of(out), "wall_s": round(wall, 1), "line": line}


def row_of(out: Path) -> dict:
    """One finished search folder: its bracket, trials and requests, and its fit judged by today's rule."""
    sys.path.insert(0, str(ROOT / "lib"))
    import pandas as pd

    from servelab.analysis.capacity import capacity_result

    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    recs = pd.read_json(out / "records.jsonl", lines=True) if (out / "records.jsonl").exists() else pd.DataFrame()
    res = capacity_result(run, recs) or {}
    warm = recs["warmup"].astype(bool) if len(recs) else pd.Series(dtype=bool)
    fit = res.get("fit") or {}
    return {"bracket": res.get("bracket"), "capacity": res.get("capacity"), "trials": res.get("trials"),
            "requests": int((~warm).sum()), "warmup_requests": int(warm.sum()), "settled": res.get("settled"),
            "reason": res.get("reason"), "fit": {k: fit.get(k) for k in ("load", "lower", "upper", "trials", "sd")} if fit else None}


def agreement(rows: list[dict]) -> dict:
    """Do the searches' fits agree? The loads inside every search's bounds (empty: none), and the
    mean over pairs of z^2 = (log a - log b)^2 / (se_a^2 + se_b^2), se from each fit's own bounds."""
    import itertools
    import math

    fits = [r["fit"] for r in rows if r.get("fit") and r["fit"].get("lower") is not None]
    if len(fits) < 2:
        return {"fits": len(fits)}
    common = [max(f["lower"] for f in fits), min(f["upper"] for f in fits)]
    se = [(math.log(f["upper"]) - math.log(f["lower"])) / (2 * 1.645) for f in fits]
    z2 = [(math.log(a["load"]) - math.log(b["load"])) ** 2 / (sa**2 + sb**2)
          for (a, sa), (b, sb) in itertools.combinations(zip(fits, se), 2)]
    return {"fits": len(fits), "loads": [round(f["load"], 2) for f in fits],
            "common": [round(x, 2) for x in common] if common[0] <= common[1] else None,
            "mean_z2": round(sum(z2) / len(z2), 2), "pairs": len(z2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start the eager SmolLM2 engine)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--port", type=int, default=8240)
    ap.add_argument("--lib", help="another checkout's lib/ (its servelab runs the searches)")
    ap.add_argument("--replay", action="store_true", help="read OUT/search-* again instead of running searches")
    ap.add_argument("--out")
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="two small searches against the reference server, then --replay; writes under DIR")
    a = ap.parse_args()
    if a.smoke:
        engine_params(a.max_num_seqs, a.port)  # planned, not started
        from servelab.measure.selfcheck import RefProcess

        with RefProcess(**SMOKE_SERVER) as ref:
            repeat(ref.url, a.smoke, 2, None, SMOKE_SEARCH)
        replay(a.smoke)
        return 0
    if not a.out:
        ap.error("--out is needed (or --smoke DIR)")
    out = Path(a.out)
    if a.replay:
        replay(out)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    eng = None if a.url else start_engine(a.max_num_seqs, a.port, out / "engine")
    try:
        repeat(a.url or eng.base_url, out, a.runs, a.lib)
    finally:
        if eng is not None:
            eng.stop()
    return 0


def replay(out: Path) -> None:
    """The finished searches OUT/search-* read again: OUT/fit.json."""
    rows = [row_of(d) for d in sorted(out.glob("search-*"), key=lambda d: int(d.name.split("-")[1]))]
    summary = {"runs": rows, "agreement": agreement(rows)}
    print(json.dumps(summary["agreement"]))
    (out / "fit.json").write_text(json.dumps(summary, indent=1))


def repeat(url: str, out: Path, runs: int, lib: str | None, args: list[str] = SEARCH) -> None:
    """`runs` searches back to back, one line each, and OUT/repeat.json."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(runs):
        rows.append(search(url, out / f"search-{i + 1}", lib, args))
        r = rows[-1]
        print(f"search {i + 1}: bracket {r['bracket']} capacity {r['capacity']} trials {r['trials']} "
              f"requests {r['requests']} (+{r['warmup_requests']} warm-up) {r['wall_s']} s; {r['line']}", flush=True)
    same = len({json.dumps(r["bracket"]) for r in rows}) == 1
    agree = agreement(rows)
    print(f"same bracket every time: {same}; trials {sum(r['trials'] or 0 for r in rows) / len(rows):.1f} and "
          f"requests {sum(r['requests'] for r in rows) / len(rows):.0f} per search (mean); fits: {json.dumps(agree)}")
    (out / "repeat.json").write_text(json.dumps({"search": args, "lib": lib, "runs": rows, "same_bracket": same,
                                                 "agreement": agree}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
