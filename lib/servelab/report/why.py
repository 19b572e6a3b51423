"""The write-up's "Why" section: every surprise of the study (a change far outside what its lever
leads one to expect, `analysis.surprises`) with its numbers and the follow-up sweeps the levers
table names for it (`servelab explain`); and, for a study that sweeps one knob, the law the sweep
follows at each level, its knee (the smallest value within 10 % of the reference), and the figure.
Words from i18n/why.yaml; numbers from the study's verdicts."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ..analysis import surprises as su
from ..schema.levers import load_levers
from .fmt import num, pct
from .load import StudyData, baselines
from .verdicts import rows


def study_surprises(sd: StudyData) -> list[su.Surprise]:
    return su.detect(rows(sd, aa=False), {c: sd.engine_params(c) for c in sd.config_ids}, load_levers())


def _value(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def sweep_points(sd: StudyData, sw: su.Sweep) -> pd.DataFrame:
    """level, config, value, effect, ci_low, ci_high of one sweep (the reference at effect 0)."""
    r = rows(sd, aa=False)
    out = []
    for lv in dict.fromkeys(r["level"]):
        out.append({"level": lv, "config": sw.reference, "value": _value(sw.values[sw.reference]),
                    "effect": 0.0, "ci_low": 0.0, "ci_high": 0.0})
        for cid, val in sw.values.items():
            x = r[(r["configuration"] == cid) & (r["level"] == lv)]
            if cid == sw.reference or x.empty:
                continue
            ci = x["ci"].iloc[0] if isinstance(x["ci"].iloc[0], list) else [math.nan, math.nan]
            out.append({"level": lv, "config": cid, "value": _value(val), "effect": float(x["effect"].iloc[0]),
                        "ci_low": ci[0] if ci[0] is not None else math.nan,
                        "ci_high": ci[1] if ci[1] is not None else math.nan})
    return pd.DataFrame(out)


def study_sweeps(sd: StudyData) -> list[su.Sweep]:
    return su.sweeps({c: sd.engine_params(c) for c in sd.config_ids}, baselines(sd))


def knees(points: pd.DataFrame) -> dict[str, float]:
    """Each level's knee value (`analysis.surprises.knee`)."""
    out = {}
    for lv, g in points.groupby("level", sort=False):
        k = su.knee(dict(zip(g["config"], g["value"])), dict(zip(g["config"], g["effect"])))
        if k is not None:
            out[lv] = k[1]
    return out


def why_section(sd: StudyData) -> tuple[str, list[tuple[str, pd.DataFrame, dict[str, float]]]]:
    """(Markdown, [(knob, sweep points, knees)]) of the section: the surprises first, then each
    sweep's law and knee per level."""
    lab, parts, figs = sd.labels(), [], []
    found = study_surprises(sd)
    grouped: dict[tuple[str, str, str, str], list[su.Surprise]] = {}
    for s in found:  # one sentence per change and lever, its levels listed
        grouped.setdefault((s.config, s.baseline, s.flag, s.rule), []).append(s)
    for (cid, base, flag, rule), ss in grouped.items():
        lever = load_levers().of(flag)
        where = sd.w("story.list_sep").join(sd.w("why.at", effect=pct(x.effect * 100), level=x.level,
                                                lo=pct(x.ci[0] * 100), hi=pct(x.ci[1] * 100)) for x in ss)
        parts.append(sd.w(f"why.surprise.{rule}", config=lab.get(cid, cid), baseline=lab.get(base, base), flag=flag,
                          n=len(ss), where=where, why=lever.why if lever else ""))
    if found:
        suspects = {s.flag for s in found}
        parts.append(sd.w("why.followups", study=sd.study.study,
                          configs=", ".join(sorted({s.config for s in found})),
                          knobs=", ".join(sorted({x.knob for f in suspects for x in (load_levers().of(f).suspects
                                                                                    if load_levers().of(f) else [])}))))
    for sw in study_sweeps(sd):
        pts = sweep_points(sd, sw)
        kn = knees(pts)
        lines = []
        for lv, g in pts.groupby("level", sort=False):
            law = su.fit_law(g["value"].map(lambda x: math.log2(x) if x and x > 0 else math.nan), g["effect"])
            k = kn.get(lv)
            knee_text = (sd.w("why.knee", value=f"{k:g}") if k is not None else sd.w("why.no_knee"))
            if law["matters"]:
                lines.append(sd.w("why.law", level=lv, slope=pct(law["slope"] * 100), lo=pct(law["slope_ci"][0] * 100),
                                  hi=pct(law["slope_ci"][1] * 100), r2=num(law["r2"], 2), knee=knee_text))
            else:
                lines.append(sd.w("why.no_law", level=lv, knee=knee_text))
        parts.append(sd.w("why.sweep", knob=sw.flag, reference=lab.get(sw.reference, sw.reference),
                          n=len(sw.values), lines=" ".join(lines)))
        figs.append((sw.flag, pts, kn))
    if not parts:
        return sd.w("why.none"), []
    return "\n\n".join(parts), figs


__all__ = ["study_surprises", "study_sweeps", "sweep_points", "knees", "why_section"]
