"""The study's story, one change at a time: the headline (3-6 sentences computed from the data,
each pointing to its section) and the progression table. A change is judged level by level
(`analysis.verdicts` through data/verdicts.json): faster, slower or no detectable change with the
smallest change the study could have told apart (MDE), instead of a median over levels that hides a
large effect on a few. Each change's outputs at
temperature 0 are compared with its baseline's (`quality.json`, `analysis.quality.compare`); a
change that alters outputs or lowers the task score is said so. Dummy-weight studies say quality
was not measurable rather than print an agreement that proves nothing.

Not for the numbers themselves (`analysis`), nor for the other sections (`sections`, `diagnosis`).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

import pandas as pd

from ..analysis import config_diff, goodput, knee, kv_verdict
from ..analysis import verdicts
from ..analysis.quality import compare
from ..engines.flags import json_value
from ..runfolder import ENGINE_LOG, TUNE_JSON
from . import html
from . import verdicts as rv
from . import workload
from .accuracy import headline as accuracy_headline
from .capacity import tune_value
from .gpu import engine_comparison_table
from .load import StudyData, baselines, engine_layout
from .money import cost_sentence
from .why import headline as why_headline
from .fmt import _open_loop, in_flight, link, num, pct, quality, slo_parts  # noqa: F401  (re-exported)



def settings_changed(sd: StudyData, cid: str, base: str) -> list[tuple[str, Any, Any]]:
    """`config_diff` with a setting added or removed as a whole block counted once:
    `speculative-config: – → {method: ngram, ...}` is one lever, not four."""
    diffs = config_diff(sd.engine_params(base), sd.engine_params(cid))
    groups: dict[str, list[tuple[str, Any, Any]]] = {}
    for d in diffs:
        groups.setdefault(".".join(d[0].split(".")[:2]), []).append(d)
    out = []
    for key, items in groups.items():
        whole = len(items) > 1 and (all(a is None for _, a, _ in items) or all(b is None for _, _, b in items))
        if not whole:
            out.extend(items)
            continue
        a, b = (_subtree(sd.engine_params(x), key) for x in (base, cid))
        out.append((key, a, b))
    return out


def _subtree(params: dict[str, Any], path: str) -> Any:
    cur: Any = params
    for part in path.split("."):
        cur = json_value(cur).get(part) if isinstance(json_value(cur), dict) else None
    return json_value(cur)


def _value(v: Any) -> str:
    if v is None:
        return html.MISSING
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def change_text(sd: StudyData, cid: str, base: str) -> str:
    """What changed from the baseline, one lever per item ("args.enforce-eager: True → –"), the parallel
    layout named first when it changed ("layout: TP=1 (1 GPU) → TP=2 (2 GPUs)")."""
    diffs = settings_changed(sd, cid, base)
    if not diffs:
        return sd.w("configs.no_change")
    return "; ".join(layout_change(sd, cid, base) + [f"{k}: {_value(a)} → {_value(b)}" for k, a, b in diffs])


def layout_change(sd: StudyData, cid: str, base: str) -> list[str]:
    """["layout: TP=1 (1 GPU) → TP=2 (2 GPUs)"] when the configuration's layout differs from its baseline's, else []."""
    a, b = engine_layout(sd, base), engine_layout(sd, cid)
    if a == b:
        return []
    return [sd.w("configs.layout_change", before=layout_name(sd, a), after=layout_name(sd, b))]


def layout_name(sd: StudyData, lay: Any) -> str:
    """"TP=2 (2 GPUs)": a layout's label and its GPU count in the page's language."""
    if lay.gpus == 1:
        return sd.w("configs.layout.one", label=lay.label())
    return sd.w("configs.layout.many", label=lay.label(), n=lay.gpus)


def method_text_prompt_sets(sd: StudyData) -> str:
    """The method paragraph for a workload drawn from prompt sets (real text, natural lengths)."""
    wl = sd.study.workload
    ignore = [b.label for b in wl.buckets if b.prompt_set and b.ignores_eos(wl.ignore_eos)]
    stop = sd.w("story.method_forced", buckets=", ".join(ignore)) if ignore else sd.w("story.method_eos")
    api = "/v1/chat/completions" if wl.api == "chat" else "/v1/completions"
    sets = ", ".join(dict.fromkeys(f"`{b.prompt_set}`" for b in wl.buckets if b.prompt_set))
    q = sd.study.quality
    same = all(b.same_prompts for b in wl.buckets if b.prompt_set)
    return sd.w("story.method_prompt_sets", api=api, temperature=wl.temperature, seed=wl.seed, sets=sets, stop=stop,
                order=sd.w("story.order_same" if same else "story.order_rotate"),
                warm_cap=sd.w("story.warm_cap", n=wl.warmup_max_tokens) if wl.warmup_max_tokens and wl.warmup_rounds else "",
                warmup=wl.warmup_rounds, rounds=wl.rounds, k=wl.requests_per_round,
                salt=sd.w("method.salt_on") if wl.cache_salt else sd.w("method.salt_off"),
                more=sd.w("story.method_more") if sd.design.interleaved and sd.design.budget_s else "",
                qwhen=sd.w("story.quality_before" if sd.design.interleaved else "story.quality_after"),
                qsets=", ".join(f"`{x}`" for x in q.sets), qmax=q.max_tokens)


def repeats(sd: StudyData) -> dict[str, str]:
    """Configurations that repeat their baseline's engine settings exactly (an A/A pair): {config: baseline}."""
    return {c: b for c, b in baselines(sd).items() if not settings_changed(sd, c, b)}


def exact_repeats(sd: StudyData) -> set[str]:
    """A/A repeats that also send their baseline's workload: the baseline measured again, nothing
    new (a repeat with its own workload, such as a saturation sweep, measures levels of its own)."""
    own = {c.id: c for c in sd.study.configurations}
    return {c for c in repeats(sd) if c in own and not own[c].workload and own[c].capacity is None}


def effects(sd: StudyData) -> pd.DataFrame:
    """Per-level verdicts of every change against its baseline on the level's lead metric
    (`analysis.verdicts.lead_metric`; aggregate tok/s where a study's records give no decode speed), A/A repeats left
    out (they are the noise model's check, not changes): the verdict rows with `config`, `metric`,
    percent columns (`change_pct`, `ci_low_pct`, `ci_high_pct`, `mde_pct`) and the level's
    `target_input_tokens` for ordering."""
    both = [rv.rows(sd, m, aa=False) for m in (verdicts.DECODE, verdicts.PRIMARY)]
    dec, agg = (x[x["effect"].notna()] for x in both)
    dec = dec[dec["concurrency"].map(verdicts.lead_metric) == verdicts.DECODE]
    have = set(zip(dec["configuration"], dec["level"]))
    agg = agg[[k not in have for k in zip(agg["configuration"], agg["level"])]]
    r = pd.concat([dec, agg]).rename(columns={"configuration": "config"})
    if r.empty:
        return pd.DataFrame(columns=["config", "baseline", "bucket", "concurrency", "metric", "change_pct", "ci_low_pct",
                                     "ci_high_pct", "mde_pct", "verdict", "target_input_tokens"])
    # study order of the configurations, and each one's levels in the order they were measured
    every = both[1]
    order = {c: i for i, c in enumerate(dict.fromkeys(every["configuration"]))}
    levels = {lv: i for i, lv in enumerate(dict.fromkeys(every["level"]))}
    r = r.iloc[sorted(range(len(r)), key=lambda i: (order.get(r["config"].iloc[i], 0), levels.get(r["level"].iloc[i], 0)))]
    r = r.reset_index(drop=True)
    s = sd.summary
    tin = s.groupby(["bucket", "concurrency"])["target_input_tokens"].first() if len(s) else {}
    return r.assign(change_pct=r["effect"] * 100, ci_low_pct=[c[0] * 100 for c in r["ci"]],
                    ci_high_pct=[c[1] * 100 for c in r["ci"]], mde_pct=r["mde"] * 100,
                    target_input_tokens=[tin.get((b, c), 0) for b, c in zip(r["bucket"], r["concurrency"])])


# -- quality -------------------------------------------------------------------------------------

def real_weights(sd: StudyData, cid: str) -> bool:
    """False for dummy (random) weights: the run's model facts say so, or the engine loaded `dummy`."""
    run = sd.info(cid)
    if run.facts.get("real_weights") is not None:
        return bool(run.facts["real_weights"])
    return run.load_format != "dummy"


def quality_compare(sd: StudyData, cid: str, base: str) -> dict[str, Any] | None:
    """`analysis.quality.compare` of the configuration against its baseline; None when either
    has no quality.json or the check was not measurable."""
    q, qb = quality(sd, cid), quality(sd, base)
    if q is None or qb is None or not q.get("measurable") or not qb.get("measurable"):
        return None
    return compare(q, qb)


def quality_cell(sd: StudyData, cid: str, base: str | None) -> str:
    """The progression table's "outputs vs baseline" cell."""
    if not real_weights(sd, cid):
        return sd.w("story.quality_dummy")
    q = quality(sd, cid)
    if q is None:
        return sd.w("story.quality_missing")
    if not q.get("measurable"):
        return q.get("reason") or sd.w("story.quality_dummy")
    c, t = (q.get("score") or {}).get("correct", 0), (q.get("score") or {}).get("total", 0)
    if base is None:
        return sd.w("story.quality_is_baseline", c=c, t=t)
    cmp_ = quality_compare(sd, cid, base)
    if cmp_ is None:
        return sd.w("story.quality_missing")
    (c, t), (bc, _) = cmp_["score"], cmp_["baseline_score"]
    if not cmp_["changed"]:
        return sd.w("story.quality_identical", identical=cmp_["identical"], total=cmp_["total"], c=c, t=t)
    first = (cmp_.get("first_divergence") or [{}])[0]
    return sd.w("story.quality_changed", identical=cmp_["identical"], total=cmp_["total"],
                token=first.get("token_index", html.MISSING), first=first.get("id", html.MISSING), c=c, t=t, base_c=bc)


def _quality_sentences(sd: StudyData, cid: str, base: str) -> list[str]:
    cmp_ = quality_compare(sd, cid, base)
    if cmp_ is None:
        return []
    lab = sd.labels()
    out = []
    if cmp_["changed"]:
        out.append(sd.w("story.outputs_changed", identical=cmp_["identical"], total=cmp_["total"],
                        baseline=lab.get(base, base)))
    if cmp_["score_dropped"]:
        out.append(sd.w("story.score_dropped", base_c=cmp_["baseline_score"][0], c=cmp_["score"][0],
                        t=cmp_["score"][1]))
    return out


# -- headline --------------------------------------------------------------------------------------

def _mde_range(sd: StudyData, rows: pd.DataFrame) -> str:
    lo, hi = rows["mde_pct"].min(), rows["mde_pct"].max()
    return f"±{num(lo, 0)} %" if round(lo) == round(hi) else sd.w("story.range", lo=f"±{num(lo, 0)}", hi=f"±{num(hi, 0)} %")


def change_sentence(sd: StudyData, e: pd.DataFrame, cid: str) -> str:
    """One change in a sentence with one number: its lead metric's change where it is largest among
    the levels that found one (at one request in flight first), with its 95 % interval and how many
    levels went each way; or how small a change none of its levels could tell apart. Then whether it
    changed the outputs. Every level's verdict is in the progression and verdict tables."""
    lab = sd.labels()
    base = e["baseline"].iloc[0]
    common = {"config": lab.get(cid, cid), "baseline": lab.get(base, base), "what": change_text(sd, cid, base),
              "n": len(e)}
    found = e[e["verdict"].isin([verdicts.FASTER, verdicts.SLOWER])]
    if len(found):
        c1 = found[found["concurrency"] == 1]
        pick = c1 if len(c1) else found
        r = pick.loc[pick["change_pct"].abs().idxmax()]
        text = sd.w("story.change_one" if len(e) > 1 else "story.change_one_level", **common, metric=sd.w(f"story.metric.{r['metric']}"), delta=pct(r["change_pct"]),
                    where=sd.w("story.at_level", bucket=r["bucket"], inflight=in_flight(sd, r["concurrency"], cid, r["bucket"])),
                    lo=pct(r["ci_low_pct"]), hi=pct(r["ci_high_pct"]), counts=sd.w("story.count_sep").join(
                        sd.w(f"story.count.{k}", k=n) for k, n in (
                            ("faster", int((e["verdict"] == verdicts.FASTER).sum())), ("slower", int((e["verdict"] == verdicts.SLOWER).sum())),
                            ("none", int((~e.index.isin(found.index)).sum()))) if n))
    else:
        text = sd.w("story.change_none" if len(e) > 1 else "story.change_none_one_level", **common, mde=_mde_range(sd, e))
    return " ".join([text, *_quality_sentences(sd, cid, base)])


MAX_HEADLINE_CHANGES = 3
MAX_HEADLINE = 6  # bullets: a headline is a handful of lines, one number each


def headline_changes(eff: pd.DataFrame) -> list[str]:
    """The changes the headline tells, in study order: all when there are at most
    `MAX_HEADLINE_CHANGES`, else those with the largest detected effect."""
    eff = eff.dropna(subset=["change_pct"])  # open-loop trials (a capacity search) share no level
    order = list(dict.fromkeys(eff["config"]))
    if len(order) <= MAX_HEADLINE_CHANGES:
        return order
    found = eff["verdict"].isin([verdicts.FASTER, verdicts.SLOWER])
    size = {c: float(g.loc[found[g.index], "change_pct"].abs().max()) if found[g.index].any() else 0.0
            for c, g in eff.groupby("config", sort=False)}
    keep = set(sorted(order, key=lambda c: -size[c])[:MAX_HEADLINE_CHANGES])
    return [c for c in order if c in keep]


def _start_sentence(sd: StudyData, s: pd.DataFrame) -> str:
    """Where the study starts: the first configuration's per-request decode speed at one request in
    flight; the fastest configuration's aggregate peak where no level has
    one request in flight."""
    lab = sd.labels()
    first = sd.config_ids[0]
    c1 = s[(s["config"] == first) & (s["concurrency"] == 1) & s["decode_tps_p50"].notna()]
    if len(c1) and not _open_loop(sd, first):
        r = c1.iloc[0]
        return sd.w("story.single_request", label=lab.get(first, first), tps=num(r["decode_tps_p50"], 1),
                    bucket=r["bucket"]) + " " + link(sd, "results")
    best = s.loc[s["aggregate_output_tps"].idxmax()]
    return sd.w("story.fastest", label=lab.get(best["config"], best["config"]), peak=num(best["aggregate_output_tps"], 0),
                bucket=best["bucket"], inflight=in_flight(sd, best["concurrency"], best["config"], best["bucket"])
                ) + " " + link(sd, "results")


def headline(sd: StudyData) -> str:
    """The headline as at most `MAX_HEADLINE` Markdown bullets, one number each: where the study
    starts (a single request's decode speed), each change (up to `MAX_HEADLINE_CHANGES`) with its
    interval, the most output under the SLO, then what else the study found, by priority: a
    surprise, a tuning search, the workload's cache hits, outputs that cannot be checked, a KV cache
    that limits, the other engine, the cost, where throughput stops growing. Predictions, the
    verdicts' model and each level's verdict have their own sections."""
    s = sd.summary
    if s.empty:
        return html.MISSING
    lab = sd.labels()
    # an A/A repeat is the baseline measured again (the noise), not a configuration to pick
    chosen = s[~s["config"].isin(exact_repeats(sd))]
    s = chosen if len(chosen) else s
    out = [_start_sentence(sd, s)]
    eff = effects(sd)
    picked = headline_changes(eff)
    changes = [change_sentence(sd, eff[eff["config"] == cid], cid) + " " + link(sd, "progression") for cid in picked]
    if changes and len(picked) < eff["config"].nunique():
        changes[-1] += " " + sd.w("story.more_changes", n=eff["config"].nunique() - len(picked))
    out.extend(changes)
    g = goodput(s, sd.study.slo).dropna(subset=["goodput_concurrency"])
    if len(g):
        r = g.loc[g["aggregate_output_tps"].idxmax()]
        flag = rv.physics_note(sd, r["config"], r["bucket"], r["goodput_concurrency"])
        out.append(sd.w("story.goodput", slo=slo_parts(sd), tps=num(r["aggregate_output_tps"], 0),
                        inflight=in_flight(sd, r["goodput_concurrency"], r["config"], r["bucket"]),
                        label=lab.get(r["config"], r["config"]), bucket=r["bucket"]) + " " + link(sd, "saturation")
                   + (" " + flag if flag else ""))
    else:
        out.append(sd.w("headline.no_goodput", slo=slo_parts(sd)) + " " + link(sd, "saturation"))
    out.extend(x for x in _more(sd, s) if x)
    return "\n".join(f"- {x}" for x in out[:MAX_HEADLINE] if x)


def _more(sd: StudyData, s: pd.DataFrame) -> list[str]:
    """The headline's further sentences, most telling first (`headline` keeps what fits)."""
    out = [why_headline(sd) and why_headline(sd) + " " + link(sd, "why")]
    acc = accuracy_headline(sd)
    out.append(acc and acc + " " + link(sd, "accuracy"))
    tune = _tune_sentence(sd)
    out.append(tune and tune + " " + link(sd, "tune"))
    hits = workload.headline_sentence(sd)
    out.append(hits and hits + " " + link(sd, "workload"))
    if not any(real_weights(sd, c) for c in sd.config_ids):
        out.append(sd.w("story.quality_not_measurable", reason=sd.w("story.dummy_reason")) + " " + link(sd, "progression"))
    limited = [sd.labels().get(c, c) for c in sd.config_ids
               if sd.samples(c) is not None and kv_verdict(sd.samples(c))["limited"]]
    if limited:
        out.append(sd.w("headline.kv_limited", configs=", ".join(limited)) + " " + link(sd, "kv"))
    out.extend(_engines_and_cost(sd))
    out.append(_saturation_sentence(sd, s.loc[s["aggregate_output_tps"].idxmax()]["config"]))
    return out


def _tune_sentence(sd: StudyData) -> str:
    """A `tune:` study's search in one sentence: where it ended, its gain, what it kept and rejected."""
    t = sd.file(TUNE_JSON) or {}
    fin = t.get("final") or {}
    if not fin:
        return ""
    n = {k: sum(1 for x in t.get("steps", []) if x.get("verdict") == k) for k in ("kept", "rejected", "failed")}
    return sd.w("story.tune", final=sd.labels().get(fin["config"], fin["config"]),
                objective=sd.w(f"tune.objective.{t['objective']}"), value=tune_value(sd, t["objective"], fin["objective"]),
                gain=fin.get("gain_pct") or 0.0, **n)


def _saturation_sentence(sd: StudyData, best_config: str) -> str:
    lab = sd.labels()
    kn = knee(sd.summary)
    # open-loop levels share one concurrency (the in-flight cap): no knee over it to speak of
    kn = kn[[not _open_loop(sd, c) for c in kn["config"]]] if len(kn) else kn
    # a bucket measured at one concurrency (a replayed trace, a single level) has no curve
    levels = sd.summary.groupby(["config", "bucket"])["concurrency"].nunique() if len(kn) else None
    kn = kn[[levels.get((c, b), 0) >= 2 for c, b in zip(kn["config"], kn["bucket"])]] if len(kn) else kn
    kn = kn[kn["top_concurrency"] == kn["top_concurrency"].max()]  # the widest sweep says most
    plateau = kn[kn["plateau"]].sort_values("knee_concurrency")
    fastest = kn[kn["config"] == best_config]
    pick = plateau if len(plateau) else (fastest if len(fastest) else kn)
    if not len(pick):
        return ""
    r = pick.iloc[0]
    if r["plateau"]:
        return sd.w("story.saturates", label=lab.get(r["config"], r["config"]), bucket=r["bucket"],
                    inflight=in_flight(sd, r["knee_concurrency"])) + " " + link(sd, "saturation")
    return sd.w("story.not_saturated", label=lab.get(r["config"], r["config"]), bucket=r["bucket"],
                inflight=in_flight(sd, r["top_concurrency"])) + " " + link(sd, "saturation")


def _engines_and_cost(sd: StudyData) -> list[str]:

    out, lab = [], sd.labels()
    cmp_ = engine_comparison_table(sd)
    if len(cmp_):
        ref = cmp_["reference"].iloc[0]
        other = cmp_[cmp_["engine"] != cmp_.loc[cmp_["config"] == ref, "engine"].iloc[0]]  # the other engine's
        best = other.groupby("config", sort=False)["aggregate_vs_reference"].median().idxmax()
        r = other[other["config"] == best]["aggregate_vs_reference"]
        out.append(sd.w("headline.engines", other=lab.get(best, best), ref=lab.get(ref, ref), n=len(r),
                        lo=pct((r.min() - 1) * 100), hi=pct((r.max() - 1) * 100)) + " " + link(sd, "gpu"))
    cost, flag = cost_sentence(sd)
    out.append(cost and cost + " " + link(sd, "cost") + (" " + flag if flag else ""))
    return out


# -- progression table -------------------------------------------------------------------------------

def startup_s(sd: StudyData, cid: str) -> float:
    return float((sd.runs.get(cid) or {}).get("server", {}).get("startup_s") or math.nan)


def _startup_cell(sd: StudyData, cid: str, base: str) -> str:
    a, b = startup_s(sd, base), startup_s(sd, cid)
    if not (math.isfinite(a) and math.isfinite(b)):
        return html.MISSING
    comp, _ = compile_s(sd, cid)
    if math.isfinite(comp):
        return sd.w("story.startup_compile", a=num(a, 0), b=num(b, 0), c=num(comp, 0))
    return f"{num(a, 0)} → {num(b, 0)}"


def progression_table(sd: StudyData) -> Any:
    """One row per change: from -> to, what changed, its verdicts over the levels (faster / slower /
    no detectable change), the change where one was found, the MDE where none was, start-up beside
    it, and outputs vs baseline."""
    eff = effects(sd)
    if eff.empty:
        return None
    lab, cols, rows, multi = sd.labels(), sd.w("story.progression_columns"), [], False
    for cid, e in eff.groupby("config", sort=False):
        base = e["baseline"].iloc[0]
        found = e[e["verdict"].isin([verdicts.FASTER, verdicts.SLOWER])]
        rest = e[~e.index.isin(found.index)]
        mark = ""
        if len(settings_changed(sd, cid, base)) > 1:
            mark, multi = " †", True
        parts = []
        for verdict in (verdicts.FASTER, verdicts.SLOWER):  # one range per direction: never "-21.8 % to +105.7 %"
            f = found[found["verdict"] == verdict]
            if len(f):
                lo, hi = f["change_pct"].min(), f["change_pct"].max()
                parts.append(f"{sd.w('verdict.' + ('faster' if verdict == verdicts.FASTER else 'slower'))} "
                             + (pct(lo) if len(f) == 1 else sd.w("story.range", lo=pct(lo), hi=pct(hi))))
        there = sd.w("story.list_sep").join(parts) or html.MISSING
        counts = sd.w("story.verdict_counts", f=int((e["verdict"] == verdicts.FASTER).sum()),
                      s=int((e["verdict"] == verdicts.SLOWER).sum()), n=len(rest))
        rows.append([f"{lab.get(base, base)} → {lab.get(cid, cid)}", change_text(sd, cid, base), counts + mark, there,
                     _mde_range(sd, rest) if len(rest) else html.MISSING, _startup_cell(sd, cid, base),
                     quality_cell(sd, cid, base)])
    t = pd.DataFrame(rows, columns=cols)
    notes = {"†": sd.w("story.multi_change")} if multi else None
    return html.table(t, sd.w("story.progression_caption"), notes=notes)


_COMPILE = re.compile(r"torch\.compile took ([0-9.]+) s in total")
_CACHE_HIT = re.compile(r"[Dd]irectly load(?:ed)? the compiled graph|[Ll]oad(?:ed|ing)? AOT compiled function")
# vLLM's CPU runner says no "took": it compiles while it warms up, between these two lines
_WARMUP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d).{0,40}\] Warming up (model for the compilation|done)")


def compile_s(sd: StudyData, cid: str) -> tuple[float, bool]:
    """(seconds torch.compile took at start-up, whether it loaded graphs from the compile cache)
    from the engine log vLLM wrote ("torch.compile took 24.31 s in total"); NaN when it did not
    compile (eager) or the log is not kept."""
    f = sd.folders.get(cid)
    if f is None or not f.exists(ENGINE_LOG):
        return math.nan, False
    text = (f / ENGINE_LOG).read_text(encoding="utf-8", errors="replace")
    times = [float(x) for x in _COMPILE.findall(text)]
    if not times:
        times = _warmup_span(text)
    return (sum(times) if times else math.nan), bool(_CACHE_HIT.search(text))


def _warmup_span(text: str) -> list[float]:
    """Seconds (to the log's whole second) between vLLM CPU's "Warming up model for the
    compilation..." and its "Warming up done." lines."""
    start, out = None, []
    for stamp, what in _WARMUP.findall(re.sub(r"\x1b\[[0-9;]*m", "", text)):  # without the log's colours
        t = datetime.strptime(stamp, "%m-%d %H:%M:%S")
        if what.startswith("model"):
            start = t
        elif start is not None:
            out.append((t - start).total_seconds() % 86400)
            start = None
    return out
