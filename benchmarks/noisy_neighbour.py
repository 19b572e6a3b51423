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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("clone")
    ap.add_argument("--study", default="local-cpu")
    ap.add_argument("--delay", type=float, default=5.0, help="seconds after the first measured round starts")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the busy processes run")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--during", choices=["rounds", "starts"], default="rounds")
    a = ap.parse_args()
    clone = Path(a.clone).resolve()
    runs = clone / "runs" / a.study
    t0 = time.time()
    log = open(clone / "make-report.log", "w")
    run = subprocess.Popen(["make", "report"], cwd=clone, stdout=log, stderr=subprocess.STDOUT)
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
                  f"for {a.seconds:.0f} s ({noise_at - t0:.0f} s into make report)", flush=True)
        time.sleep(0.5)
    wall = time.time() - t0
    print(f"make report: exit {run.returncode}, {int(wall // 60)} min {wall % 60:.0f} s")
    design = clone / "reports" / a.study / "data" / "design.json"
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
