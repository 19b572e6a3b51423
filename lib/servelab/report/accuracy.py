"""The answers' side of the write-up: each configuration's one-at-a-time answers against the model's
own (transformers, float32), and its answers under load (canaries sent in each level's warm-up round:
`measure.sources.canary`) against its one-at-a-time ones, with the quality-adjusted goodput. Pure
functions of a published study's files. Not for the statistics (`analysis.quality`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis.quality import NON_INFERIORITY_MARGIN, canaries
from ..analysis.saturation import slo_check
from . import html
from .fmt import num
from .load import StudyData
from .fmt import in_flight, quality


def reference_text(sd: StudyData) -> str:
    """Each configuration's answers held against the model's own (quality.json's `reference`:
    transformers, float32, greedy), and the CPU that made each; "" when no configuration has one."""
    refs = {cid: (quality(sd, cid) or {}).get("reference") for cid in sd.config_ids}
    refs = {c: r for c, r in refs.items() if r and r.get("available")}
    if not refs:
        return ""
    lab, first = sd.labels(), next(iter(refs.values()))

    def one(cid: str, r: dict[str, Any]) -> str:
        d = (r.get("first_divergence") or [{}])[0]
        key = "story.ref_same" if r["identical"] == r["total"] else "story.ref_changed"
        return sd.w(key, label=lab.get(cid, cid), identical=r["identical"], total=r["total"],
                    token=d.get("token_index", html.MISSING), first=d.get("id", html.MISSING))

    machines = sorted({r.get("this_machine") or "" for r in refs.values()})
    return sd.w("story.reference", impl=first.get("implementation", ""),
                made_on=html.quote_md(first.get("computed_on", ""), sd.language), date=first.get("computed_at", ""),
                tokens=first.get("max_tokens", ""), machine=html.quote_md(", ".join(machines), sd.language),
                answers=sd.w("story.list_sep").join(one(c, r) for c, r in refs.items()))


def canary_rows(sd: StudyData) -> pd.DataFrame:
    """`analysis.quality.canaries` of every configuration, with `config`."""
    recs = sd.records
    rows = []
    for cid in sd.config_ids:
        r = recs[recs["config"] == cid] if len(recs) and "config" in recs else recs
        rows += [{"config": cid, **x} for x in canaries(r, quality(sd, cid))]
    return pd.DataFrame(rows)


def _share(k: int, n: int, ci: list[float]) -> str:
    return f"{k} / {n} ({num(ci[0] * 100, 0)}-{num(ci[1] * 100, 0)} %)"


def accuracy_section(sd: StudyData) -> tuple[str, Any]:
    """(text, table) of the answers under load: per configuration and level, the canaries answered
    as one at a time (with the 95 % interval) and where the first one differed, the score under load
    against one at a time, and whether it holds; the quality-adjusted goodput. ("", None) when the
    study sent no canaries."""
    t = canary_rows(sd)
    if t.empty:
        return "", None
    lab, cols = sd.labels(), sd.w("accuracy.columns")
    out = []
    for r in t.itertuples():
        d = r.first_divergence if isinstance(r.first_divergence, dict) else None
        out.append([lab.get(r.config, r.config), f"{r.bucket} · {in_flight(sd, r.concurrency, r.config, r.bucket)}",
                    _share(r.identical, r.canaries, r.identical_ci),
                    sd.w("accuracy.first", token=d["token_index"], id=d["id"]) if d else html.MISSING,
                    _share(r.score, r.canaries, r.score_ci), f"{r.score_alone} / {r.canaries}",
                    sd.w(f"accuracy.quality.{r.quality}")])
    text = sd.w("accuracy.text", margin=num(NON_INFERIORITY_MARGIN * 100, 0))
    qg = quality_goodput(sd, t)
    if qg:
        text += " " + qg
    return text, html.table(pd.DataFrame(out, columns=cols), sd.w("accuracy.caption"))


def quality_goodput(sd: StudyData, t: pd.DataFrame | None = None) -> str:
    """The highest aggregate tok/s at a level that meets the SLO and whose answers hold under load (a
    level of one request in flight answers one at a time: it holds by definition)."""
    t = canary_rows(sd) if t is None else t
    s = sd.summary
    if s.empty:
        return ""
    chk = slo_check(s, sd.study.slo)
    held = {(r.config, r.bucket, r.concurrency): r.quality for r in t.itertuples()} if len(t) else {}
    holds = pd.Series([held.get((c, b, int(k)), "holds" if int(k) == 1 else "untested") == "holds"
                       for c, b, k in zip(chk["config"], chk["bucket"], chk["concurrency"])], index=chk.index)
    ok = chk[chk["meets_slo"].astype(bool) & holds]
    if ok.empty or not ok["aggregate_output_tps"].notna().any():
        return sd.w("accuracy.no_goodput")
    r = ok.loc[ok["aggregate_output_tps"].idxmax()]
    return sd.w("accuracy.goodput", tps=num(r["aggregate_output_tps"], 0), label=sd.labels().get(r["config"], r["config"]),
                bucket=r["bucket"], inflight=in_flight(sd, r["concurrency"], r["config"], r["bucket"]))


def headline(sd: StudyData) -> str:
    """One sentence: where answers under load differ from one at a time (the largest share that
    differs, with its interval), or that none did, over how many canaries."""
    t = canary_rows(sd)
    if t.empty:
        return ""
    n, k = int(t["canaries"].sum()), int(t["identical"].sum())
    if k == n:
        lo = min(x[0] for x in t["identical_ci"])
        return sd.w("accuracy.head_same", n=n, levels=len(t), lo=num(lo * 100, 0))
    w = t.loc[(t["identical"] / t["canaries"]).idxmin()]
    return sd.w("accuracy.head_changed", label=sd.labels().get(w["config"], w["config"]), bucket=w["bucket"],
                inflight=in_flight(sd, w["concurrency"], w["config"], w["bucket"]), k=int(w["identical"]),
                n=int(w["canaries"]), lo=num(w["identical_ci"][0] * 100, 0), hi=num(w["identical_ci"][1] * 100, 0),
                total_k=k, total_n=n)


__all__ = ["accuracy_section", "canary_rows", "headline", "quality_goodput", "reference_text"]
