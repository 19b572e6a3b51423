"""Do two runs of one study reach the same verdicts? Two `data/verdicts.json` files (e.g. the default
study published from two fresh clones' `make report`) side by side: per (configuration, level) of the
primary metric, each run's verdict, effect, 95 % interval and MDE, whether they agree, whether one says
faster where the other says slower, and the A/A rows.

    .venv/bin/python benchmarks/verdict_agreement.py RUN_A/reports/local-cpu RUN_B/reports/local-cpu

    .venv/bin/python benchmarks/verdict_agreement.py --smoke DIR     # the published default study with itself

Not a test: what two runs on one machine gave (the issue's "two fresh-clone make report runs agree").
`--smoke DIR` (make test runs it) leaves nothing out: the published reports/local-cpu against itself
(it writes nothing, DIR included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(study: str) -> dict[tuple[str, str], dict]:
    p = Path(study)
    p = p / "data" / "verdicts.json" if p.is_dir() else p
    d = json.loads(p.read_text())
    return {(r["configuration"], r["level"]): r for r in d["rows"] if r["metric"] == "aggregate_output_tps"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", metavar="RUN", help="two study folders (reports/<study>) or verdicts.json files")
    ap.add_argument("--smoke", type=Path, metavar="DIR", help="the published default study against itself")
    args = ap.parse_args()
    if args.smoke:
        args.runs = [str(ROOT / "reports" / "local-cpu")] * 2
    if len(args.runs) != 2:
        ap.error("two runs are needed (or --smoke DIR)")
    a, b = load(args.runs[0]), load(args.runs[1])
    keys = [k for k in a if k in b]
    changes = [k for k in keys if not a[k]["aa"]]
    agree = sum(a[k]["verdict"] == b[k]["verdict"] for k in changes)
    flips = [k for k in changes if {a[k]["verdict"], b[k]["verdict"]} == {"faster", "slower"}]
    print(f"{'configuration':14} {'level':14} {'run A':28} {'run B':28} same")
    for k in keys:
        ra, rb = a[k], b[k]
        cell = lambda r: f"{r['verdict'][:10]:10} {r['effect'] * 100:+6.1f}% mde {r['mde'] * 100:4.1f}%"  # noqa: E731
        print(f"{k[0]:14} {k[1]:14} {cell(ra):28} {cell(rb):28} {'yes' if ra['verdict'] == rb['verdict'] else 'NO'}"
              + ("  (A/A)" if ra["aa"] else ""))
    aa = [k for k in keys if a[k]["aa"]]
    aa_ok = all(a[k]["verdict"] == b[k]["verdict"] == "no detectable change" for k in aa)
    worst = max(max(a[k]["mde"], b[k]["mde"]) for k in changes) * 100 if changes else float("nan")
    print(f"\nchanges: {agree} of {len(changes)} level verdicts agree; faster in one and slower in the other: "
          f"{len(flips)} {flips or ''}; A/A rows all 'no detectable change' in both: {aa_ok}; largest MDE "
          f"{worst:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
