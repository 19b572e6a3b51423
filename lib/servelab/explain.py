"""`servelab explain STUDY CONFIG`: follow-up experiments for a surprise. The published study's
verdicts are checked for surprises (`analysis.surprises`: a change far outside what its lever
leads one to expect); none, and nothing runs. Otherwise the levers table's suspects for the lever
(`data/levers.yaml`) become one sweep each: the surprising configuration with one knob set to each
of its values, on the same server kind, measured with the same client and workload, as an
ordinary study (`reports/<study>-explain-<config>/`, re-rendered like any other, its "Why" section
giving each knob's law and where the surprise goes away). `--dry-run` prints the sweeps.
Not for the statistics (`analysis`) nor for running a study (`pipeline`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from . import yamlio

from .errors import UserError
from .log import progress_line
from .paths import reports_root, runs_root
from .pipeline import run_study
from .report import load_study_data
from .report.why import study_surprises
from .schema import study_from_dict
from .schema.levers import load_levers


def _slug(v: Any) -> str:
    return str(v).lower().replace(".", "p").replace("_", "-").replace(" ", "")


def followup_params(study_dir: Path, config: str, *, budget_s: float | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the follow-up study's params, the lines that describe its sweeps); raises UserError when the
    configuration shows no surprise."""
    sd = load_study_data(study_dir)
    if config not in sd.config_ids:
        raise UserError(f"{sd.study.study} has no measured configuration {config!r}; have {sd.config_ids}")
    found = [s for s in study_surprises(sd) if s.config == config]
    if not found:
        raise NoSurprise(f"{sd.study.study} {config}: no surprise (every verdict is within what its lever leads "
                         "one to expect); nothing to explain, nothing run")
    params = yamlio.safe_load((sd.root / "data" / "params.yaml").read_text())
    base = next(c for c in params["configurations"] if c["id"] == config)
    kind = (sd.engine_params(config) or {}).get("kind", "vllm")
    lines, confs = [], [{**base, "label": base.get("label", config) + " (as measured)", "baseline": None}]
    confs[0].pop("baseline", None)
    for flag in dict.fromkeys(s.flag for s in found):
        lever = load_levers().of(flag)
        levels = ", ".join(s.level for s in found if s.flag == flag)
        for sus in (lever.suspects if lever else []):
            if kind not in sus.engines:
                continue
            lines.append(f"sweep {sus.knob} over {sus.values} around {config} ({sus.why}); the surprise: "
                         f"{flag} at {levels}")
            own = ((base.get("engine") or {}).get("args") or {}).get(sus.knob, sus.default)
            for v in sus.values:
                if v == own:  # the surprising configuration itself: measured again as the reference
                    continue
                args = {**((base.get("engine") or {}).get("args") or {}), sus.knob: v}
                confs.append({"id": f"{config}-{_slug(sus.knob)}-{_slug(v)}", "label": f"{config}, {sus.knob} {v}",
                              "baseline": config, "engine": {**(base.get("engine") or {}), "args": args}})
        for i, fx in enumerate(f for f in (lever.fixes if lever else []) if kind in f.engines):
            lines.append(f"try {', '.join(f'{k} {v}' for k, v in fx.args.items())} ({fx.why})")
            args = {**((base.get("engine") or {}).get("args") or {}), **fx.args}
            confs.append({"id": f"{config}-fix-{i + 1}", "label": f"{config}, " + ", ".join(
                f"{k} {v}" for k, v in fx.args.items()), "baseline": config,
                "engine": {**(base.get("engine") or {}), "args": args}})
    if len(confs) == 1:
        raise UserError(f"the levers table names no suspect of {', '.join(s.flag for s in found)} for {kind}")
    out = {k: v for k, v in params.items() if k not in ("configurations", "texts", "translations", "tune")}
    if out.get("device"):  # on the GPU machine: every follow-up one after another on the study's GPU
        dev = out["device"]
        out["device"] = {k: dev[k] for k in ("gpus", "site") if k in dev} | {"lanes": [[c["id"] for c in confs]]}
    out.update(study=f"{sd.study.study}-explain-{config}", configurations=confs,
               explains={"study": sd.study.study, "config": config},
               title=f"Why {config} surprised: one suspect at a time ({sd.study.study})",
               description=f"Follow-up sweeps of {sd.study.study}'s {config}: " + "; ".join(lines))
    if budget_s:
        out["design"] = {**(out.get("design") or {}), "budget_s": budget_s}
    return out, lines


class NoSurprise(UserError):
    """The configuration's verdicts show no surprise: nothing to explain (exit 0, said so)."""


def explain(study: str, config: str, *, dry_run: bool = False, budget_s: float | None = None,
            force: bool = False) -> int:
    """Plan (and unless `dry_run`, run and publish) the follow-up study of one surprise."""
    try:
        params, lines = followup_params(reports_root() / study, config, budget_s=budget_s)
    except NoSurprise as e:
        print(str(e))
        return 0
    st = study_from_dict(json.loads(json.dumps(params)), f"{study}-explain-{config}")
    for ln in lines:
        print(ln)
    print(f"{len(st.configurations)} configurations: {', '.join(c.id for c in st.configurations)}")
    if dry_run:
        return 0
    path = runs_root() / ".explain" / f"{st.study}.yaml"  # the study's own run folder copies it
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    progress_line(f"explain: {path}")
    return run_study(st, path, force=force)


def run_followups(study: str, *, budget_s: float, max_studies: int, force: bool = False,
                  dry_run: bool = False) -> int:
    """The study option `followups:`: after a published study, `explain` every configuration with a
    surprise (at most `max_studies`, the worst first), each within `budget_s`. Returns the worst exit."""
    sd = load_study_data(reports_root() / study)
    worst: dict[str, float] = {}
    for s in study_surprises(sd):
        worst[s.config] = min(worst.get(s.config, 0.0), s.effect)
    if not worst:
        progress_line(f"follow-ups: {study} has no surprise; nothing to explain")
        return 0
    rc = 0
    for cid in sorted(worst, key=worst.get)[:max_studies]:
        progress_line(f"follow-ups: {study} {cid} (worst change {worst[cid] * 100:+.1f} %)")
        rc = max(rc, explain(study, cid, dry_run=dry_run, budget_s=budget_s, force=force))
    return rc


__all__ = ["NoSurprise", "explain", "followup_params", "run_followups"]
