"""Capacity at SLO held against itself and against a fixed grid, on one running server (the
must-show of the capacity issue): `servelab capacity` is run `--runs` times (separate runs,
separate folders), then `servelab bench` measures every level of `--grid`, each judged against the
same SLO by the report's own rule (servelab.analysis.saturation.slo_check). Prints a table and
writes agreement.json: each run's bracket, whether the brackets overlap, the grid's verdicts and
the highest level below the first failing one, and whether it lies in every bracket.

    python benchmarks/capacity_agreement.py URL --out DIR --input 256 --output 48 \\
        --slo-ttft-p95-s 2 --slo-tpot-p95-s 0.1 --grid 1,2,3,4,5,6,7,8 [--runs 2] [--rounds 3] \\
        [-- extra `servelab capacity` options]
    python benchmarks/capacity_agreement.py --smoke DIR     # against the reference server, seconds

`--smoke DIR` (make test runs it): one small search and a grid of 1-3 streams against the reference
server (its own process, 2 slots: a capacity known to be 2), written to DIR/agreement.json; it exits 0
whether or not they agreed (on a busy machine, a few requests each, they may not).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --smoke: the reference server with 2 slots (a known capacity: a third stream waits a whole request),
# requests of 4 tokens 5 ms apart (17 ms: a waiting stream's TTFT ~19 ms against the SLO's 10); one
# small search (the agreement of several goes through the same lines), the smallest grid around it
SMOKE_SERVER = {"ttft_s": 0.002, "itl_s": 0.005, "slots": 2}
SMOKE_ARGS = ["--input", "16", "--output", "4", "--slo-ttft-p95-s", "0.01", "--slo-tpot-p95-s", "0.1",
              "--grid", "1,2,3", "--runs", "1", "--rounds", "1", "--", "--max", "4", "--max-trials", "4"]


def servelab(*args: str) -> None:
    print("+ servelab " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "servelab.cli", *args], check=True)


def grid_verdicts(bench_dir: Path, slo: dict) -> list[dict]:
    from servelab.analysis.saturation import slo_check
    from servelab.runfolder import load_records
    from servelab.summary import summarize

    s = slo_check(summarize(load_records(bench_dir)), slo).sort_values("concurrency")
    return [{"concurrency": int(r.concurrency), "meets_slo": bool(r.meets_slo), "why": r.slo_fail_reason or "",
             "ttft_p95_s": float(r.ttft_p95_s), "tpot_p95_s": float(r.tpot_p95_s)} for r in s.itertuples()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", nargs="?", help="the server (none with --smoke)")
    ap.add_argument("--out")
    ap.add_argument("--model")
    ap.add_argument("--input", type=int, default=256)
    ap.add_argument("--output", type=int, default=48)
    ap.add_argument("--slo-ttft-p95-s", type=float)
    ap.add_argument("--slo-tpot-p95-s", type=float)
    ap.add_argument("--grid", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds per grid level")
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="small searches against the reference server; writes DIR/agreement.json")
    argv = sys.argv[1:]
    smoke = ap.parse_known_args(argv)[0].smoke
    if smoke:
        sys.path.insert(0, str(ROOT / "lib"))
        from servelab.measure.selfcheck import RefProcess

        with RefProcess(**SMOKE_SERVER) as ref:
            agree(ap, [ref.url, "--out", str(smoke), *SMOKE_ARGS])
        return 0  # the searches ran through; whether they agreed on a busy machine is not the point here
    return agree(ap, argv)


def agree(ap: argparse.ArgumentParser, argv: list[str]) -> int:
    """The searches, the grid and agreement.json; 0 if the brackets overlap and hold the grid's capacity."""
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    extra = argv[cut + 1:]  # after --: more `servelab capacity` options
    if None in (a.url, a.out, a.slo_ttft_p95_s, a.slo_tpot_p95_s):
        ap.error("URL, --out, --slo-ttft-p95-s and --slo-tpot-p95-s are needed (or --smoke DIR)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--input", str(a.input), "--output", str(a.output)] + (["--model", a.model] if a.model else [])
    slo = {"ttft_p95_s": a.slo_ttft_p95_s, "tpot_p95_s": a.slo_tpot_p95_s, "error_rate": 0.01}
    runs, t0 = [], time.monotonic()
    for i in range(a.runs):
        d = out / f"search-{i + 1}"
        t = time.monotonic()
        servelab("capacity", a.url, *common, "--axis", "concurrency", "--slo-ttft-p95-s", str(a.slo_ttft_p95_s),
                 "--slo-tpot-p95-s", str(a.slo_tpot_p95_s), "--out", str(d), *extra)
        res = json.loads((d / "run.json").read_text())["capacity"]["result"]
        runs.append({"folder": d.name, "capacity": res["capacity"], "bracket": res["bracket"],
                     "binding": res.get("binding"), "trials": res.get("trials"), "elapsed_s": time.monotonic() - t})
    t = time.monotonic()
    servelab("bench", a.url, *common, "--concurrency", a.grid, "--warmup", "1", "--rounds", str(a.rounds),
             "--out", str(out / "grid"), "--quiet")
    grid = grid_verdicts(out / "grid", slo)
    first_fail = next((g["concurrency"] for g in grid if not g["meets_slo"]), None)
    grid_capacity = max((g["concurrency"] for g in grid if g["meets_slo"] and (first_fail is None or
                                                                               g["concurrency"] < first_fail)),
                        default=None)
    lows = [r["bracket"][0] or 0.0 for r in runs]  # None: not even the lowest load searched met the SLO
    highs = [r["bracket"][1] if r["bracket"][1] is not None else float("inf") for r in runs]
    overlap = max(lows) < min(highs)  # [capacity, first failing load) intervals share a load
    in_every = grid_capacity is not None and all(lo <= grid_capacity < hi for lo, hi in zip(lows, highs))
    summary = {"url": a.url, "input": a.input, "output": a.output, "slo": slo, "runs": runs,
               "brackets_overlap": overlap, "grid": grid, "grid_elapsed_s": time.monotonic() - t,
               "grid_capacity": grid_capacity, "grid_first_failing": first_fail,
               "grid_capacity_in_every_bracket": in_every, "elapsed_s": time.monotonic() - t0}
    (out / "agreement.json").write_text(json.dumps(summary, indent=1) + "\n")
    for r in runs:
        print(f"{r['folder']}: capacity {r['capacity']} concurrent, bracket {r['bracket']}, binds {r['binding']}, "
              f"{r['elapsed_s']:.0f} s")
    for g in grid:
        print(f"grid c={g['concurrency']}: {'meets' if g['meets_slo'] else 'fails'} the SLO "
              f"(TTFT p95 {g['ttft_p95_s']:.2f} s, TPOT p95 {g['tpot_p95_s'] * 1000:.0f} ms) {g['why']}")
    print(f"brackets overlap: {overlap}; grid capacity {grid_capacity} (first failing {first_fail}); "
          f"in every bracket: {in_every}")
    return 0 if overlap and in_every else 1


if __name__ == "__main__":
    sys.exit(main())
