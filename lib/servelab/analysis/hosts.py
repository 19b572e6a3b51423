"""The host a GPU sits in: how much longer (or shorter) its CPU takes for the engine's CPU-side work than the
host a calibration entry was measured on. The engine's Python, its kernel launches and a request's fixed
cost (HTTP, chat template, tokenization, scheduling) run on the host's CPU, not the GPU, and two rented
machines of one kind (one H100, 16 cores) differed by half in that time on one day (docs/predictions.md). So
every CPU-side term of the model (the CUDA-graph floor, the eager launch costs, the request cost) is scaled by
one host factor:

- measured on this host before the first request (`servelab run` on a GPU machine probes it; `host_probe`
  in run.json): its eager kernel-launch time over the calibration host's (`micro.launch_eager_s`, the same
  micro-benchmark), with a band of +/-15 %;
- else, before you rent: the typical host of those seen, the geometric mean of the factors fitted on the
  published studies measured on other machines of that GPU kind (`hosts_seen` in the entry, `servelab
  calibrate-hw --hosts-from`), the band spanning the fastest and the slowest of them;
- else 1 (the calibration's own host).

`fit_factor` finds a study's factor from its measured levels: the one number that brings the model's c=1
TTFTs and TPOTs closest to them (least squares of the log ratios). No I/O."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: the band of a factor measured on the host itself: the launch probe's repeatability, not a fit
RANGE_PROBE = 0.15
#: the factor's bounds: a probe outside them is a broken measurement, not a host
FACTOR_MIN, FACTOR_MAX = 0.4, 4.0


def _launch_ref(entry: Mapping[str, Any]) -> float | None:
    v = (entry.get("micro") or {}).get("launch_eager_s")
    return float(v) if v else None


def host_factor(entry: Mapping[str, Any], probe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{factor, range: (lo, hi) multipliers of it for the band's ends, source: words} for a GPU entry and, when the
    run measured its host, that probe (`measure.hostprobe`)."""
    if (entry.get("machine") or {}).get("kind") != "gpu":
        return {"factor": 1.0, "range": (1.0, 1.0), "source": ""}
    ref = _launch_ref(entry)
    mine = float(probe["launch_eager_s"]) if probe and probe.get("launch_eager_s") else None
    if ref and mine:
        f = min(FACTOR_MAX, max(FACTOR_MIN, mine / ref))
        return {"factor": f, "range": (1.0 - RANGE_PROBE, 1.0 + RANGE_PROBE), "how": "probe",
                "source": f"this host's eager kernel launch {mine * 1e6:.2f} us over the calibration host's "
                          f"{ref * 1e6:.2f} us (x{f:.2f}, measured before the first request; +/-{RANGE_PROBE * 100:.0f} %)"}
    seen = [h for h in entry.get("hosts_seen") or [] if h.get("factor")]
    if not seen:
        return {"factor": 1.0, "range": (1.0, 1.0), "source": ""}
    fs = [float(h["factor"]) for h in seen]
    typ = math.exp(sum(math.log(f) for f in fs) / len(fs))
    lo, hi = min(fs), max(fs)  # the geometric mean lies between them
    listed = ", ".join(f"{h.get('study')} x{float(h['factor']):.2f}" for h in seen)
    return {"factor": typ, "range": (lo / typ, hi / typ), "how": "hosts seen",
            "source": f"the typical host of the {len(fs)} measured since the calibration (geometric mean x{typ:.2f} of "
                      f"{listed}; the band from the fastest to the slowest)"}


#: a level enters the fit only where the host's terms make at least this share of the model's figure (its
#: sensitivity d log model / d log factor): a GPU-bound level says nothing of the host, only of the GPU model
MIN_SENSITIVITY = 0.5


def sensitivity(fn: Callable[[float], float]) -> float:
    """d log fn / d log factor at factor 1: the share of the model's figure that the host's terms make."""
    return math.log(fn(1.1) / fn(1.0)) / math.log(1.1)


def fit_factor(points: Sequence[tuple[float, Callable[[float], float]]]) -> dict[str, Any]:
    """The host factor that brings the model closest to `points` (measured seconds, the model's seconds as a
    function of the factor): least squares of log(model / measured) over the points the host's terms dominate
    (`MIN_SENSITIVITY`), bounded to [FACTOR_MIN, FACTOR_MAX]; with each point's log error at the optimum (None for
    a point left out)."""
    from scipy.optimize import minimize_scalar

    used = [sensitivity(fn) >= MIN_SENSITIVITY for _, fn in points]
    points_all, points = points, [p for p, u in zip(points, used) if u]
    if len(points) < 2:
        raise ValueError("a host factor needs two measured levels or more whose time is mostly the host's")

    def loss(f: float) -> float:
        return sum(math.log(fn(f) / m) ** 2 for m, fn in points)
    r = minimize_scalar(loss, bounds=(FACTOR_MIN, FACTOR_MAX), method="bounded", options={"xatol": 1e-4})
    f = float(r.x)
    return {"factor": f, "n": len(points),
            "log_errors": [math.log(fn(f) / m) if u else None for (m, fn), u in zip(points_all, used)]}


__all__ = ["FACTOR_MAX", "FACTOR_MIN", "MIN_SENSITIVITY", "RANGE_PROBE", "fit_factor", "host_factor", "sensitivity"]
