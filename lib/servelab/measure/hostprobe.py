"""The host probe of a GPU machine: how long its CPU takes to launch one tiny CUDA kernel eagerly, measured
once before a study's first server starts (`pipeline`), with the engine's own Python (its torch). It is the
micro-benchmark `servelab calibrate-hw` stores as `micro.launch_eager_s` (`measure.hwbench`), so the model can
scale the engine's CPU-side terms by this host over the calibration's (`analysis.hosts`): the engine's Python,
its launches and a request's fixed cost run on this CPU. A few seconds (torch's import, the CUDA context); a
machine where it cannot run (no torch, no GPU) gets None and why, and the model takes the typical host."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from ..runfolder import now_iso

#: the probe's code, run by the engine's Python: best of 20 repeats of 200 launches of a 16-element add_, after a
#: warm-up, synchronized around each repeat (as `measure.hwbench._launch`)
PROBE = r"""
import json, time, torch
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device")
z = torch.zeros(16, device="cuda")
def tiny():
    for _ in range(200):
        z.add_(1)
best = float("inf")
tiny(); torch.cuda.synchronize()
for _ in range(20):
    torch.cuda.synchronize(); t0 = time.perf_counter(); tiny(); torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"launch_eager_s": best / 200, "torch": torch.__version__}))
"""


def probe(python: str, timeout_s: float = 180.0) -> tuple[dict[str, Any] | None, str]:
    """(the probe's result with when and how it was measured, "") or (None, why not)."""
    try:
        r = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"the host probe did not run: {type(e).__name__}: {e}"
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit status {r.returncode}"]
        return None, f"the host probe failed: {tail[0]}"
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        float(out["launch_eager_s"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None, f"the host probe printed no result: {r.stdout.strip()[-200:]!r}"
    return {**out, "measured_at": now_iso(), "python": python,
            "how": "best of 20 x 200 eager launches of a tiny CUDA kernel (calibrate-hw's launch_eager_s)"}, ""


__all__ = ["PROBE", "probe"]
