"""The write-up's "Why" section: every surprise of the study (a change far outside what its lever
leads one to expect, `analysis.surprises`) with its numbers and the follow-up sweeps the levers
table names for it (`servelab explain`); and, for a study that sweeps one knob, the law the sweep
follows at each level, its knee (the smallest value within 10 % of the reference), and the figure.
Words from i18n/why.yaml; numbers from the study's verdicts."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pandas as pd

from ..analysis import surprises as su
from ..paths import reports_root
from ..schema.levers import load_levers
from .fmt import num, pct
from .load import StudyData, baselines, load_study_data
from .verdicts import verdict_key, rows


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


def c1_tpot(sd: StudyData, cid: str) -> float:
    """The configuration's median TPOT at its lowest concurrency (first bucket), from its records."""
    s = sd.summary
    s = s[(s["config"] == cid)] if not s.empty else s
    if s.empty:
        return math.nan
    s = s[s["bucket"] == s["bucket"].iloc[0]]
    return float(s.sort_values("concurrency").iloc[0]["tpot_p50_s"])


def _unit(values: list[float]) -> tuple[float, str]:
    """A per-unit scale that reads well for a knob's values (1, 1,000 or 100,000 of them)."""
    top = max(abs(v) for v in values) if values else 1.0
    return (1e5, "100,000") if top >= 1e5 else (1e3, "1,000") if top >= 1e4 else (1.0, "1")


def time_law(sd: StudyData, sw: su.Sweep) -> dict[str, Any] | None:
    """c=1 TPOT against a numeric knob's value, by least squares (`su.fit_law`), with the points."""
    pts = [(_value(v), c1_tpot(sd, cid)) for cid, v in sw.values.items()]
    pts = [(x, y) for x, y in pts if x == x and y == y]
    if len({x for x, _ in pts}) < 3:
        return None
    law = su.fit_law([x for x, _ in pts], [y for _, y in pts])
    return {**law, "points": pts}


def fix_configs(sd: StudyData, surprises: list[su.Surprise]) -> list[tuple[str, su.Surprise, dict[str, Any]]]:
    """(configuration, the surprise it answers, the fix's flags): configurations that are a surprising
    configuration plus one of its lever's fixes (the levers table)."""
    out = []
    eps = {c: sd.engine_params(c) for c in sd.config_ids}
    for s in {(x.config, x.flag): x for x in surprises}.values():
        lever = load_levers().of(s.flag)
        base_args = dict((eps.get(s.config) or {}).get("args") or {})
        for fx in (lever.fixes if lever else []):
            want = {**base_args, **fx.args}
            for cid in sd.config_ids:
                if cid != s.config and dict((eps[cid] or {}).get("args") or {}) == want:
                    out.append((cid, s, dict(fx.args)))
    return out


def _started(sd: StudyData, cid: str) -> float:
    """When a configuration's run started (seconds since the epoch; 0 when the run does not say)."""
    try:
        return datetime.fromisoformat(str(sd.runs[cid].get("started_at"))).timestamp()
    except ValueError:
        return 0.0


def parent_of(sd: StudyData) -> tuple[StudyData | None, list[su.Surprise]]:
    """A follow-up study's published parent (`explains`) and the parent's surprises of that
    configuration; (None, []) for a study that explains nothing or whose parent is not published."""
    ex = sd.study.explains
    if ex is None:
        return None, []
    root = reports_root() / ex.study
    if not (root / "data").exists():
        return None, []
    psd = load_study_data(root).with_language(sd.language)  # its labels in this page's language
    return psd, [x for x in study_surprises(psd) if x.config == ex.config]


def _setting(ep: dict[str, Any]) -> tuple[Any, ...]:
    """What an engine serves and how: kind, model and the flags set (an omitted flag = None/false)."""
    args = {k: v for k, v in (ep.get("args") or {}).items() if v is not None and v is not False}
    return ep.get("kind"), ep.get("model"), sorted(args.items(), key=lambda kv: kv[0])


def reference(sd: StudyData, parent: StudyData | None, cid: str, near: str | None = None) -> tuple[float, str]:
    """A reference configuration's c=1 TPOT and its label: measured in this study (the
    configuration itself, else one with the parent's reference settings, the one started nearest
    in time to `near`), else quoted from the parent study it follows up (named, with the date it was
    measured)."""
    if cid in sd.config_ids or parent is None or cid not in parent.config_ids:
        return c1_tpot(sd, cid), sd.labels().get(cid, cid)
    same = [c for c in sd.config_ids if _setting(sd.engine_params(c)) == _setting(parent.engine_params(cid))]
    if same:
        t = _started(sd, near) if near else None
        here = min(same, key=lambda c: abs(_started(sd, c) - t) if t is not None else 0.0)
        return c1_tpot(sd, here), sd.labels().get(here, here)
    when = str(parent.runs[cid].get("started_at", ""))[:10]
    return c1_tpot(parent, cid), sd.w("why.quoted", label=parent.labels().get(cid, cid), study=parent.study.study,
                                      date=when)


def _fix_text(sd: StudyData, surprises: list[su.Surprise], parent: StudyData | None = None) -> list[str]:
    lab, parts = sd.labels(), []
    r = rows(sd, aa=False)
    for cid, s, args in fix_configs(sd, surprises):
        (t_ref, ref_label), t_fix, t_bad = reference(sd, parent, s.baseline, cid), c1_tpot(sd, cid), c1_tpot(sd, s.config)
        within = (t_fix - t_ref) / t_ref * 100 if t_ref == t_ref and t_ref else math.nan
        verdicts = r[r["configuration"] == cid]
        vs = sd.w("story.list_sep").join(sd.w("why.fix_verdict", level=x.level, verdict=sd.w(f"verdict.{verdict_key(x.verdict)}"),
                                              effect=pct(x.effect * 100)) for x in verdicts.itertuples())
        key = "why.fix_works" if within == within and abs(within) <= 15 else "why.fix_partial"
        parts.append(sd.w(key, fix=", ".join(f"`{k} {v}`" for k, v in args.items()), label=lab.get(cid, cid),
                          t_fix=num(t_fix * 1000, 2), t_bad=num(t_bad * 1000, 2), bad=lab.get(s.config, s.config),
                          t_ref=num(t_ref * 1000, 2), ref=ref_label, within=pct(within),
                          baseline=lab.get(baselines(sd).get(cid, s.config), s.config), verdicts=vs or "–"))
    return parts


def _surprise_text(sd: StudyData, found: list[su.Surprise]) -> list[str]:
    """One sentence per surprising change and lever (its levels listed), then the follow-ups to run."""
    lab, parts = sd.labels(), []
    grouped: dict[tuple[str, str, str, str], list[su.Surprise]] = {}
    for s in found:  # one sentence per change and lever, its levels listed
        grouped.setdefault((s.config, s.baseline, s.flag, s.rule), []).append(s)
    for (cid, base, flag, rule), ss in grouped.items():
        lever = load_levers().of(flag)
        where = sd.w("story.list_sep").join(sd.w("why.at", effect=pct(x.effect * 100), level=x.level,
                                                lo=pct(x.ci[0] * 100), hi=pct(x.ci[1] * 100)) for x in ss)
        parts.append(sd.w(f"why.surprise.{rule}", config=lab.get(cid, cid), baseline=lab.get(base, base), flag=flag,
                          n=len(ss), where=where, why=lever.why_in(sd.language) if lever else ""))
    if found:
        suspects = {s.flag for s in found}
        parts.append(sd.w("why.followups", study=sd.study.study,
                          configs=", ".join(sorted({s.config for s in found})),
                          knobs=", ".join(sorted({x.knob for f in suspects for x in (load_levers().of(f).suspects
                                                                                    if load_levers().of(f) else [])}))))
    return parts


def _sweep_text(sd: StudyData, sw: su.Sweep, surprises: list[su.Surprise],
                parent: StudyData | None) -> tuple[str, tuple[str, Any, dict[str, float] | None]]:
    """One sweep's sentence (its decode-time law, else each level's throughput law and knee) and figure."""
    lab = sd.labels()
    pts = sweep_points(sd, sw)
    kn = knees(pts)
    lines = []
    tl = time_law(sd, sw)
    timed = tl is not None and tl["matters"]
    for lv, g in ([] if timed else pts.groupby("level", sort=False)):  # a time law explains it: no effect law
        law = su.fit_law(g["value"].map(lambda x: math.log2(x) if x and x > 0 else math.nan), g["effect"])
        k = kn.get(lv)
        knee_text = (sd.w("why.knee", value=f"{k:g}") if k is not None else sd.w("why.no_knee"))
        if law["matters"]:
            lines.append(sd.w("why.law", level=lv, slope=pct(law["slope"] * 100), lo=pct(law["slope_ci"][0] * 100),
                              hi=pct(law["slope_ci"][1] * 100), r2=num(law["r2"], 2), knee=knee_text))
        else:
            lines.append(sd.w("why.no_law", level=lv, knee=knee_text))
    if timed:
        k, unit = _unit([x for x, _ in tl["points"]])
        lines.append(sd.w("why.time_law", knob=sw.flag, slope=num(tl["slope"] * k * 1000, 3), unit=unit,
                          lo=num(tl["slope_ci"][0] * k * 1000, 3), hi=num(tl["slope_ci"][1] * k * 1000, 3),
                          r2=num(tl["r2"], 3), at0=num(tl["intercept"] * 1000, 2),
                          points=", ".join(f"{x:,.0f}: {y * 1000:.2f} ms" for x, y in sorted(tl["points"]))))
        ref = next((x.baseline for x in surprises if x.config == sw.reference), None)
        if ref is not None:  # what the law leaves: its empty-pool decode time against the reference's
            t_ref, ref_label = reference(sd, parent, ref, sw.reference)
            lines.append(sd.w("why.rest", at0=num(tl["intercept"] * 1000, 2), ref=ref_label,
                              t_ref=num(t_ref * 1000, 2), rest=num((tl["intercept"] - t_ref) * 1000, 2)))
    elif tl is not None:
        lines.append(sd.w("why.no_time_law", knob=sw.flag, lo=num(tl["slope_ci"][0] * 1000, 4),
                          hi=num(tl["slope_ci"][1] * 1000, 4)))
    return (sd.w("why.sweep", knob=sw.flag, reference=lab.get(sw.reference, sw.reference),
                 n=len(sw.values), lines=" ".join(lines)),
            (sw.flag, pts, kn) if not timed else (sw.flag, tl, None))


def why_section(sd: StudyData) -> tuple[str, list[tuple[str, Any, dict[str, float] | None]]]:
    """(Markdown, figures) of the section: the surprises first, then each sweep's law (c=1 decode time
    against the knob where it follows it, else each level's throughput change and knee), then the
    fixes measured. A figure is (knob, sweep points, knees) for the throughput sweep, or (knob, the
    time law, None) for the decode-time law."""
    parts: list[str] = []
    figs: list[tuple[str, Any, dict[str, float] | None]] = []
    found = study_surprises(sd)
    parent, inherited = parent_of(sd)
    if parent is not None and inherited:  # a follow-up: what it explains, in the parent's numbers
        x = min(inherited, key=lambda y: y.effect)
        parts.append(sd.w("why.follows", study=parent.study.study, config=parent.labels().get(x.config, x.config),
                          baseline=parent.labels().get(x.baseline, x.baseline), flag=x.flag, n=len(inherited),
                          worst=pct(x.effect * 100), level=x.level))
        found_here = [y for y in inherited if y.config in sd.config_ids]
    else:
        found_here = []
    parts += _surprise_text(sd, found)
    for sw in study_sweeps(sd):
        text, fig = _sweep_text(sd, sw, found + found_here, parent)
        parts.append(text)
        figs.append(fig)
    parts += _fix_text(sd, found + found_here, parent)
    if not parts:
        return sd.w("why.none"), []
    return "\n\n".join(parts), figs


def headline(sd: StudyData) -> str:
    """The Why section in one sentence for the headline: each decode-time law and each fix measured,
    or each throughput sweep's knees; "" when the section has neither."""
    parent, inherited = parent_of(sd)
    found = study_surprises(sd) + [y for y in inherited if y.config in sd.config_ids]
    out = []
    for sw in study_sweeps(sd):
        tl = time_law(sd, sw)
        if tl is not None and tl["matters"]:
            k, unit = _unit([x for x, _ in tl["points"]])
            out.append(sd.w("why.head_law", knob=sw.flag, slope=num(tl["slope"] * k * 1000, 2), unit=unit,
                            r2=num(tl["r2"], 3)))
        else:
            kn = knees(sweep_points(sd, sw))
            if kn:
                out.append(sd.w("why.head_knees", knob=sw.flag, knees="; ".join(f"{lv}: {v:g}" for lv, v in kn.items())))
    for cid, s, args in fix_configs(sd, found):
        (t_ref, ref_label), t_fix = reference(sd, parent, s.baseline, cid), c1_tpot(sd, cid)
        within = (t_fix - t_ref) / t_ref * 100 if t_ref == t_ref and t_ref else math.nan
        out.append(sd.w("why.head_fix", fix=", ".join(f"`{k} {v}`" for k, v in args.items()), t_fix=num(t_fix * 1000, 2),
                        within=pct(within), ref=ref_label))
    return " ".join(out)


__all__ = ["c1_tpot", "headline", "fix_configs", "parent_of", "reference", "knees", "study_surprises", "study_sweeps", "sweep_points", "time_law", "why_section"]
