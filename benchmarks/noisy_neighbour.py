"""`make report` from a fresh clone with a noisy neighbour: some seconds after the first measured round
of the interleaved benchmark begins, start busy processes (`python3 -c "while True: pass"`, not
children of the run) for a while, then let the run finish. Prints the wall time, when the
disturbance ran, and what the run's design.json says it found (disturbed rounds, measured again).

    python3 benchmarks/noisy_neighbour.py CLONE [--study local-cpu] [--delay 5] [--seconds 30] [--procs 2]
                                            [--during rounds|starts]

`--during starts`: the delay counts from the moment the engines begin to start (the configurations'
run folders appear) instead.

CLONE is a fresh clone (`git clone . "$(mktemp -d)/x"`); the command it runs is the README's
`make report`. Not a test: what one machine did; the verdicts are compared with a quiet run by
benchmarks/verdict_reruns.py.

    .venv/bin/python benchmarks/noisy_neighbour.py --smoke DIR      # a few seconds, under DIR

`--smoke DIR` (make test runs it) leaves out the fresh clone and its `make report` (8-9 min): a
`servelab bench` of a few rounds against the reference server stands in, writing its run folder where
the study's would be (DIR/runs/<study>/); one busy process runs for 1 s, 0.2 s after the first measured
round, and the printout reads the published study's design.json (reports/<study>/data/).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def first_measured_round(runs: Path) -> bool:
    """Whether any configuration's client_stats.jsonl has a measured (not warm-up) round."""
    for f in runs.glob("*/client_stats.jsonl"):
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                if not json.loads(line).get("warmup"):
                    return True
            except json.JSONDecodeError:
                continue
    return False


ROOT = Path(__file__).resolve().parents[1]
# --smoke: the stand-in for `make report` (a few rounds of `servelab bench`) and a short, small neighbour
SMOKE_BENCH = ["--input", "16", "--output", "4", "--concurrency", "1", "--warmup", "1", "--rounds", "8",
               "--requests-per-round", "1", "--quiet"]
SMOKE_NOISE = {"delay": 0.2, "seconds": 1.0, "procs": 1, "during": "rounds"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("clone", nargs="?", help="a fresh clone (none with --smoke)")
    ap.add_argument("--study", default="local-cpu")
    ap.add_argument("--delay", type=float, default=5.0, help="seconds after the first measured round starts")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the busy processes run")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--during", choices=["rounds", "starts"], default="rounds")
    ap.add_argument("--smoke", type=Path, metavar="DIR",
                    help="a few rounds of `servelab bench` against the reference server instead of make report")
    a = ap.parse_args()
    if a.smoke:
        sys.path.insert(0, str(ROOT / "lib"))
        from servelab.measure.selfcheck import RefProcess

        vars(a).update(SMOKE_NOISE)
        a.smoke.mkdir(parents=True, exist_ok=True)
        with RefProcess(ttft_s=0.05, itl_s=0.05) as ref:
            bench = [sys.executable, "-m", "servelab.cli", "bench", ref.url, *SMOKE_BENCH,
                     "--out", str(a.smoke / "runs" / a.study / "smoke")]
            return watch(a, bench, a.smoke, ROOT / "reports" / a.study / "data" / "design.json", "servelab bench")
    if not a.clone:
        ap.error("CLONE is needed (or --smoke DIR)")
    clone = Path(a.clone).resolve()
    return watch(a, ["make", "report"], clone, clone / "reports" / a.study / "data" / "design.json", "make report")


def watch(a: argparse.Namespace, cmd: list[str], clone: Path, design: Path, name: str) -> int:
    """Run `cmd` (`name`) in `clone`, start the neighbour when the study's rounds (or starts) have begun, and
    print what design.json then says."""
    runs = clone / "runs" / a.study
    t0 = time.time()
    log = open(clone / "make-report.log", "w")
    run = subprocess.Popen(cmd, cwd=clone, stdout=log, stderr=subprocess.STDOUT)
    noise_at = None
    while run.poll() is None:
        begun = first_measured_round(runs) if a.during == "rounds" else any(runs.glob("*/params.effective.yaml"))
        if noise_at is None and begun:
            time.sleep(a.delay)
            loop = f"import time\nt = time.time()\nwhile time.time() - t < {a.seconds}: pass"
            # in the background of a shell that exits at once: not the run's children
            subprocess.run(["sh", "-c", " ".join(f"{sys.executable} -c '{loop}' &" for _ in range(a.procs))], check=True)
            noise_at = time.time()
            print(f"noise: {a.procs} busy processes from {time.strftime('%H:%M:%S', time.gmtime(noise_at))} UTC "
                  f"for {a.seconds:.0f} s ({noise_at - t0:.0f} s into {name})", flush=True)
        time.sleep(0.5)
    wall = time.time() - t0
    print(f"{name}: exit {run.returncode}, {int(wall // 60)} min {wall % 60:.0f} s")
    if design.exists():
        d = json.loads(design.read_text())
        for lv in d.get("levels", []):
            print(f"  {lv['label']}: rounds {max(lv['rounds'].values())}, stopped {lv['stopped']}, disturbed "
                  f"{lv.get('disturbed', 0)}, measured again {lv.get('remeasured', 0)} ({lv.get('remeasure_s', 0):.0f} s, "
                  f"waited {lv.get('waited_s', 0):.0f} s), warm-up {lv.get('warmup_s', 0):.0f} s")
        for w in (d.get("launch") or {}).get("windows", []):
            print(f"  engine starts disturbed: {time.strftime('%H:%M:%S', time.gmtime(w['from']))}-"
                  f"{time.strftime('%H:%M:%S', time.gmtime(w['to']))} UTC, up to {w['busy_cpu']:.1f} cores, "
                  f"starts {', '.join(w['starts'])}")
    if noise_at is None:
        print("noise: never started (no measured round seen)")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
