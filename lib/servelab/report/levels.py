"""Per-level parts of the write-up for real-model studies: speculative decoding measured from the
engine's counters per level (acceptance, mean accepted length, acceptance by draft position,
drafts/s), the speed-up per prompt set (the same configuration's speed varies with the
text) and how long each part of the run took (start-up and compilation, benchmark, quality check).

Reads the level summary's `spec_*` columns (or levels.jsonl rows with them), records'
`prompt_set`, run.json and quality.json; computes nothing the analyses already do. Not for the
headline (`progress`).
"""

from __future__ import annotations

import math
import re
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd
from .. import yamlio

from ..analysis.stats import pct_change as _pct_change
from ..engines import get as engine_profile
from ..schema.runfiles import SampledLevel
from . import html
from .load import StudyData, baselines
from .fmt import quality
from .progress import compile_s
from .fmt import minutes
from .sections import pct

SPEC_COLUMNS = ["spec_acceptance_rate", "spec_mean_accepted_len", "spec_draft_tokens_per_s",
                "spec_accepted_per_position"]
LEVELS_JSONL = "levels.jsonl"
_LABEL = re.compile(r"^(?P<bucket>.+) c=(?P<conc>\d+)$")


def speculates(sd: StudyData, cid: str) -> bool:
    ep = sd.engine_params(cid)
    return bool(engine_profile(ep.get("kind", "vllm")).speculative(ep.get("args") or {}))


def spec_levels(sd: StudyData, cid: str) -> pd.DataFrame:
    """The configuration's per-level speculative counters: bucket, concurrency and `SPEC_COLUMNS`,
    from the summary when it carries them, else from levels.jsonl (its `label` names the level)."""
    s = sd.summary
    if not s.empty and "spec_acceptance_rate" in s.columns:
        rows = s[s["config"] == cid]
        return rows[["bucket", "concurrency", *[c for c in SPEC_COLUMNS if c in rows.columns]]].reset_index(drop=True)
    f = sd.folders.get(cid)
    out = []
    for lv in (f.jsonl(LEVELS_JSONL) if f is not None and f.exists(LEVELS_JSONL) else []):
        m = _LABEL.match(str(lv.get("label", "")))
        bucket = lv.get("bucket") or (m.group("bucket") if m else None)
        conc = lv.get("concurrency") or (int(m.group("conc")) if m else None)
        if bucket is None or conc is None or "spec_acceptance_rate" not in lv:
            continue
        out.append({"bucket": bucket, "concurrency": int(conc), **{c: lv.get(c) for c in SPEC_COLUMNS}})
    return pd.DataFrame(out, columns=["bucket", "concurrency", *SPEC_COLUMNS])


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _positions(v: Any) -> str:
    if not isinstance(v, (list, tuple)) or not v:
        return html.MISSING
    return " / ".join(f"{float(x) * 100:.0f}" if _finite(x) else html.MISSING for x in v)


def set_label(sd: StudyData, bucket: str) -> str:
    """The prompt set a bucket draws from ("rewrite"), with the bucket's name when the set
    feeds more than one bucket or the bucket has its own name ("questions (forced 64)");
    the bucket alone for the calibrated filler."""
    r = sd.records
    if r.empty or "prompt_set" not in r.columns:
        return bucket
    sets = [x for x in r.loc[r["bucket"] == bucket, "prompt_set"].dropna().unique() if x]
    if not sets:
        return bucket
    name = str(sets[0])
    shared = r.loc[r["prompt_set"] == name, "bucket"].nunique() > 1
    return name if bucket == name or (not shared and bucket.startswith(f"{name}-out")) else f"{name} ({bucket})"


def spec_table(sd: StudyData) -> tuple[str, Any]:
    """(text, table): one row per level of each speculating configuration."""
    bases, rows = baselines(sd), []
    s = sd.summary
    for cid in sd.config_ids:
        if not speculates(sd, cid):
            continue
        base = bases.get(cid)
        for r in spec_levels(sd, cid).itertuples():
            mine = s[(s["config"] == cid) & (s["bucket"] == r.bucket) & (s["concurrency"] == r.concurrency)]
            theirs = s[(s["config"] == base) & (s["bucket"] == r.bucket) & (s["concurrency"] == r.concurrency)]
            vs = (pct(_pct_change(mine["aggregate_output_tps"].iloc[0], theirs["aggregate_output_tps"].iloc[0]))
                  if len(mine) and len(theirs) else html.MISSING)
            rate = r.spec_acceptance_rate
            rows.append([sd.labels().get(cid, cid), set_label(sd, r.bucket), int(r.concurrency),
                         float(rate) * 100 if _finite(rate) else math.nan,
                         float(r.spec_mean_accepted_len) if _finite(r.spec_mean_accepted_len) else math.nan,
                         _positions(r.spec_accepted_per_position),
                         float(r.spec_draft_tokens_per_s) if _finite(r.spec_draft_tokens_per_s) else math.nan, vs])
    if not rows:
        return sd.w("spec.none"), None
    c = sd.w("spec.columns")
    t = pd.DataFrame(rows, columns=c)
    return sd.w("spec.text"), html.table(t, sd.w("spec.title"), formats={c[3]: "{:,.1f}", c[4]: "{:,.2f}",
                                                                         c[6]: "{:,.1f}"})


# -- speed-up per prompt set ---------------------------------------------------------------------------

def prompt_set_table(sd: StudyData) -> tuple[str, Any]:
    """(text, table): median decode tok/s per request per prompt set at the lowest concurrency,
    each configuration against its baseline, with the output length p50 / p95 (EOS-stopped sets
    end where the model stops)."""
    r = sd.records
    named = r["prompt_set"].fillna("").astype(str) != "" if "prompt_set" in r.columns else None
    if r.empty or named is None or not named.any():
        return sd.w("prompts.none"), None
    m = r[(~r["warmup"]) & (r["ok"]) & named]
    conc = int(m["concurrency"].min())
    m = m[m["concurrency"] == conc]
    kinds = _set_kinds(sd)
    bases, rows = baselines(sd), []
    med = m.groupby(["bucket", "config"])["decode_tps"].median()
    for bucket in dict.fromkeys(m["bucket"]):
        for cid in sd.config_ids:
            g = m[(m["bucket"] == bucket) & (m["config"] == cid)]
            if g.empty:
                continue
            base = bases.get(cid)
            vs = (pct(_pct_change(med[(bucket, cid)], med[(bucket, base)]))
                  if base is not None and (bucket, base) in med.index else html.MISSING)
            name = str(g["prompt_set"].iloc[0])
            out = g["output_tokens"].astype(float)
            rows.append([set_label(sd, bucket), kinds.get(name, html.MISSING), sd.labels().get(cid, cid), float(med[(bucket, cid)]), vs,
                         f"{np.percentile(out, 50):,.0f} / {np.percentile(out, 95):,.0f}"])
    c = sd.w("prompts.columns")
    return (sd.w("prompts.text", conc=conc),
            html.table(pd.DataFrame(rows, columns=c), sd.w("prompts.caption", conc=conc), formats={c[3]: "{:,.1f}"}))


def _set_kinds(sd: StudyData) -> dict[str, str]:
    """Prompt set name -> kind (copy | free), from the shipped sets when they can be read."""
    try:
        out = {}
        for p in (resources.files("servelab") / "data" / "prompts").iterdir():
            if p.name.endswith(".yaml"):
                d = yamlio.safe_load(p.read_text(encoding="utf-8")) or {}
                out[d.get("name", p.name[:-5])] = d.get("kind", html.MISSING)
        return out
    except (OSError, ModuleNotFoundError, TypeError):
        return {}


# -- time per part -------------------------------------------------------------------------------------

def timing_rows(sd: StudyData) -> pd.DataFrame:
    """Per configuration, in seconds: start-up (launch to healthy; `shared_server` when the same
    server process was started once for an earlier configuration), torch.compile's share, the
    benchmark (first send -> last end, warm-up included) and the quality check."""
    interleaved = sd.design.interleaved
    rows, seen = [], set()
    for cid in sd.config_ids:
        srv, rec = sd.info(cid).server, sd.folders[cid].records
        key = (srv.pid, srv.startup_s, srv.base_url)
        shared = srv.startup_s is not None and key in seen
        seen.add(key)
        comp, hit = compile_s(sd, cid)
        rows.append({"config": cid, "startup_s": float(srv.startup_s or math.nan), "shared_server": shared,
                     "compile_s": comp, "compile_cache_hit": hit,
                     "benchmark_s": _benchmark_s(rec, interleaved),
                     "quality_s": float((quality(sd, cid) or {}).get("elapsed_s") or math.nan)})
    return pd.DataFrame(rows, columns=["config", "startup_s", "shared_server", "compile_s", "compile_cache_hit",
                                       "benchmark_s", "quality_s"])


def _benchmark_s(rec: pd.DataFrame, interleaved: bool) -> float:
    """First send to last end; measured interleaved, the sum of the configuration's own rounds (its
    first and last request span the other engines' rounds too)."""
    if rec.empty:
        return math.nan
    if not interleaved:
        return float(rec["end_s"].max() - rec["start_s"].min())
    g = rec.groupby(["level", "round"])
    return float((g["end_s"].max() - g["start_s"].min()).sum())


def budget_text(sd: StudyData, quality_s: float) -> str:
    """Where an interleaved study's time went (design.json): engine starts two at a time, the
    quality checks (their wall time where design.json has it, else the sum of their times), the rounds per level and why each level stopped, against
    the time budget."""
    d = sd.design
    if not d.interleaved or not d.launch:
        return ""
    launch, bench = float(d.launch.wall_s), float(d.benchmark_s or 0.0)

    def level(x: SampledLevel) -> str:
        extra = [e for e in (sd.w("timing.warmup", s=minutes(sd, x.warmup_s)) if x.warmup_s else "",
                             sd.w("timing.again", n=x.remeasured, s=minutes(sd, x.remeasure_s))
                             if x.remeasured else "") if e]
        return sd.w("timing.level", level=x.label, rounds=max(x.rounds.values()), s=minutes(sd, x.seconds),
                    extra=f" ({sd.w('story.list_sep').join(extra)})" if extra else "",
                    why=sd.w(f"verdicts.stopped.{x.stopped}"))

    levels = sd.w("story.list_sep").join(level(x) for x in d.levels)
    together = d.quality_s is not None  # recorded since the checks run two at a time: their wall time
    quality_s = float(d.quality_s) if together else quality_s
    total = launch + quality_s + bench
    key = "timing.budget" if d.budget_s else "timing.no_budget"
    return sd.w(key, total=minutes(sd, total), budget=minutes(sd, float(d.budget_s or 0)),
                launch=minutes(sd, launch), lanes=d.lanes if d.lanes is not None else 1, quality=minutes(sd, quality_s),
                checked=sd.w("timing.checked_two" if together else "timing.checked_one"), bench=minutes(sd, bench),
                levels=levels)


def timing_table(sd: StudyData) -> tuple[str, Any]:
    """(text, table): time per part of each configuration and the study's total."""
    t = timing_rows(sd)
    if t.empty:
        return "", None
    starts = float(np.nansum(t.loc[~t["shared_server"], "startup_s"]))
    bench, qual = float(np.nansum(t["benchmark_s"])), float(np.nansum(t["quality_s"]))
    text = sd.w("timing.text" if qual > 0 else "timing.text_no_quality", total=minutes(sd, starts + bench + qual), starts=minutes(sd, starts),
                bench=minutes(sd, bench), quality=minutes(sd, qual))
    budget = budget_text(sd, qual)
    if budget:
        text = sd.w("timing.text_interleaved") + " " + budget
    c = sd.w("timing.columns")
    compiled = [sd.w("timing.cached", s=f"{x:,.0f}") if hit and math.isfinite(x) else x
                for x, hit in zip(t["compile_s"], t["compile_cache_hit"])]
    startup = [sd.w("timing.shared", s=f"{x:,.0f}") if sh else x for x, sh in zip(t["startup_s"], t["shared_server"])]
    df = pd.DataFrame({c[0]: [sd.labels().get(x, x) for x in t["config"]], c[1]: startup, c[2]: compiled,
                       c[3]: t["benchmark_s"], c[4]: t["quality_s"]})
    fmt = {k: (lambda v: v if isinstance(v, str) else f"{v:,.0f}") for k in c[1:]}
    return text, html.table(df, sd.w("timing.caption"), formats=fmt,
                          notes={html.MISSING: sd.w("timing.dash")} if df.isna().to_numpy().any() else None)
