"""A study's verdicts, derived once from its files: every change against its baseline per level
and metric under the two-level model (`analysis.verdicts`), with how the study was measured
(design.json: interleaved or one at a time, the time budget, why each level's sampling stopped).
`study_verdicts` is what `data/verdicts.json` holds; the headline, the progression table and the
verdict table read it. Not for the statistics themselves (`analysis.verdicts`)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import pandas as pd

from ..analysis import verdicts
from ..analysis.stats import stepped_levels, warming_levels, warming_measured_again
from ..runfolder import VERDICTS_JSON, read_json, write_json
from . import html
from .fmt import link, minutes, num, pct
from .load import StudyData, baselines


def _requests(sd: StudyData) -> pd.DataFrame:
    r = sd.records
    if r.empty:
        return pd.DataFrame(columns=["config", "bucket", "concurrency", "n"])
    m = r[~r["warmup"]]
    return m.groupby(["config", "bucket", "concurrency"]).size().rename("n").reset_index()


def study_verdicts(sd: StudyData) -> dict[str, Any]:
    """verdicts.json of the study, computed from its records (deterministic)."""
    d = sd.design
    target = float(d.mde_target or sd.study.design.mde_target_pct / 100.0)
    groups = verdicts.setting_groups({c: sd.engine_params(c) for c in sd.config_ids})
    cmps = verdicts.comparisons(baselines(sd), groups)
    servers = {c: sid for sid, s in ((d.placement or {}).get("servers") or {}).items() for c in s.get("configs") or []}
    rows, betweens = verdicts.verdict_rows(sd.rounds, cmps, verdicts.starts_of(groups, servers), target=target,
                                           requests=_requests(sd), given_sd_pct=sd.study.design.between_starts_sd_pct)
    stopped = {x.label: x.stopped for x in d.levels}
    rows["stopped"] = [stopped.get(lv, "fixed") for lv in rows["level"]]
    out = verdicts.to_json(rows, betweens, target=target,
                    design={"interleaved": d.interleaved, "reason": d.reason, "budget_s": d.budget_s,
                            "first_rounds": d.first_rounds, "max_rounds": d.max_rounds},
                    to_target=(verdicts.plan_from_design(d, groups, rows, betweens[verdicts.PRIMARY], target)
                               if verdicts.PRIMARY in betweens else None))
    out["physics"] = physics_check(sd)
    out["warming"] = warming_levels(sd.records)
    again = warming_measured_again(sd.records)
    if again:  # only where a run measured a level again (older pages' files unchanged)
        out["warming_measured_again"] = again
    stepped = stepped_levels(sd.records)
    if stepped:  # only where a level changed speed (older pages' files unchanged)
        out["speed_step"] = stepped
    return out


def physics_check(sd: StudyData) -> dict[str, Any]:
    """Every configuration's levels against the physical floors (`analysis.physics`): {checked, flags, not_checked
    per configuration}. What the check needs that only the files say is read here: the engine's own weight size
    (its log), cached prompt tokens per level (the records), the engine's routing report (routing.json, written by
    `servelab routing`)."""
    from ..analysis import physics
    from ..analysis.perfmodel import identical_requests, router_ties
    from ..analysis.predict import hardware_of
    from ..engines import get as profile
    from ..engines.flags import engine_args, get_flag
    from ..runfolder import ENGINE_LOG, ROUTING_JSON, read_json

    flags, checked, skipped = [], 0, {}
    for cid in sd.config_ids:
        run, rf = sd.runs[cid], sd.folders[cid]
        facts = (run.get("model") or {}).get("facts") or {}
        hw, n = hardware_of(run)
        if hw is not None and hw.get("memory_type") == "host DRAM":
            hw = None  # a CPU: its copy bandwidth is a measurement, not a peak
        ep = run.get("engine_params") or {}
        kind, args = ep.get("kind", "vllm"), engine_args(ep.get("args"))
        prof = profile(kind)
        wl = sd.study.workload_for(cid)
        recs = rf.records
        prefix: dict[str, float] = {}
        if len(recs) and "cached_tokens" in recs and recs["cached_tokens"].notna().any():
            ok = recs[~recs["warmup"].astype(bool)]
            for (b, c), g in ok.groupby(["bucket", "concurrency"]):
                prefix[f"{b} c={int(c)}"] = float(g["cached_tokens"].fillna(0).mean())
        log = (rf.path / ENGINE_LOG).read_text(errors="replace") if rf.exists(ENGINE_LOG) else ""
        loaded = prof.loaded_weight_bytes(log)
        res = physics.check_levels(
            rf.summary, facts, hw, n, config=cid, identical=identical_requests(wl),
            kv_dtype=str(get_flag(args, "kv-cache-dtype") or "auto"), ties=router_ties(run),
            dummy=ep.get("load_format") == "dummy", speculative=prof.speculative(args),
            shared_prefix=any(b.shared_prefix or b.prefix_reuse for b in wl.buckets),
            prefix=prefix, loaded_bytes=loaded * n if loaded else None,
            routing=read_json(rf.path / ROUTING_JSON) if rf.exists(ROUTING_JSON) else None)
        checked += res["checked"]
        flags += res["flags"]
        if res["not_checked"]:
            skipped[cid] = res["not_checked"]
    return {"rule": "a decode step's bytes (weights under spread routing, KV read) over the GPUs' peak bandwidth; "
                    "a c=1 prefill's FLOPs over their peak FLOP/s (data/hardware.yaml)",
            "checked": checked, "flags": flags, "not_checked": skipped}


def write_study_verdicts(sd: StudyData) -> dict[str, Any]:
    """Compute and write `data/verdicts.json` (the write-up renders from it)."""
    out = study_verdicts(sd)
    write_json(sd.data_dir / VERDICTS_JSON, out)
    return out


@lru_cache(maxsize=8)
def _cached(path: str, mtime: float) -> dict[str, Any]:
    return read_json(path)


def load(sd: StudyData) -> dict[str, Any]:
    """The study's verdicts.json (computed when the folder has none, e.g. a runs/ folder)."""
    for d in (sd.root / "data", sd.root):
        p = d / VERDICTS_JSON
        if p.exists():
            return _cached(str(p), p.stat().st_mtime)
    return study_verdicts(sd)


def rows(sd: StudyData, metric: str = verdicts.PRIMARY, *, aa: bool | None = None) -> pd.DataFrame:
    """The verdict rows of one metric (A/A rows only, none, or both with `aa` None)."""
    r = verdicts.from_json(load(sd))
    r = r[r["metric"] == metric]
    if aa is not None:
        r = r[r["aa"] == aa]
    return r.reset_index(drop=True)


def between_starts(sd: StudyData, metric: str = verdicts.PRIMARY) -> dict[str, Any]:
    """verdicts.json's between-start estimate of one metric (sd_pct, df, source, starts)."""
    return (load(sd).get("between_starts") or {}).get(metric) or {}


def lead_points(sd: StudyData) -> pd.DataFrame:
    """The opening figure's points (`plots.change_vs_configuration`): every comparison's change with its
    95 % interval and verdict, on a single request's decode speed at one request in flight (a point per
    bucket) and on aggregate tok/s at the most requests in flight the comparison measured in each bucket
    (above one). Columns: config, baseline, aa, panel (`DECODE` or `PRIMARY`), bucket, concurrency,
    effect, lo, hi, verdict (relative changes); comparisons in study order, A/A pairs last."""
    cols = ["config", "baseline", "aa", "panel", "bucket", "concurrency", "effect", "lo", "hi", "verdict"]
    r = verdicts.from_json(load(sd))
    if r.empty:
        return pd.DataFrame(columns=cols)
    r = r[r["effect"].map(lambda x: isinstance(x, (int, float)) and math.isfinite(x))]
    dec = r[(r["metric"] == verdicts.DECODE) & (r["concurrency"] == 1)]
    agg = r[(r["metric"] == verdicts.PRIMARY) & (r["concurrency"] > 1)]
    agg = agg[agg["concurrency"] == agg.groupby(["configuration", "bucket"])["concurrency"].transform("max")]
    order = {c: i for i, c in enumerate(sd.config_ids)}
    buckets = {b: i for i, b in enumerate(dict.fromkeys(r["bucket"]))}
    out = [[x["configuration"], x["baseline"], bool(x["aa"]), panel, x["bucket"], int(x["concurrency"]),
            float(x["effect"]), float(x["ci"][0]), float(x["ci"][1]), x["verdict"]]
           for panel, part in ((verdicts.DECODE, dec), (verdicts.PRIMARY, agg)) for _, x in part.iterrows()]
    p = pd.DataFrame(out, columns=cols)
    key = [(bool(a), order.get(c, len(order)), i, buckets.get(b, 0)) for a, c, i, b in
           zip(p["aa"], p["config"], p["panel"].map({verdicts.DECODE: 0, verdicts.PRIMARY: 1}), p["bucket"])]
    return p.iloc[sorted(range(len(p)), key=lambda i: key[i])].reset_index(drop=True)


def lead_figure(sd: StudyData) -> Any:
    """The figure the page opens with, under its title: each change's effect with its 95 % interval
    and the A/A pairs beside them (`lead_points`); None where the study compares nothing."""
    from . import plots

    pts = lead_points(sd)
    if pts.empty:
        return None
    caption = sd.w("figure.change_vs_configuration")
    if pts["aa"].any():
        caption += " " + sd.w("figure.change_vs_configuration_aa")
    return html.figure(plots.change_vs_configuration(pts, sd.labels(), sd.colors, lang=sd.language), caption)


# -- the write-up's words for them ------------------------------------------------------------------

def model_sentence(sd: StudyData, *, with_link: bool = True) -> str:
    """How the verdicts were reached: the two-level model, where its between-start variance comes
    from, and whether the configurations were measured interleaved."""
    b, d = between_starts(sd), load(sd).get("design") or {}
    how = sd.w("story.measured_interleaved") if d.get("interleaved") else sd.w("story.measured_one_by_one")
    if b.get("source") == "repeats":
        starts = ", ".join(" / ".join(sd.labels().get(x, x) for x in g) for g in b.get("starts", []))
        key = "story.between_repeats" if (b.get("sd_pct") or 0.0) >= 0.05 else "story.between_repeats_none"
        text = sd.w(key, sd=num(b.get("sd_pct") or 0.0, 1), df=num(b.get("df") or 0, 0), starts=starts)
    elif b.get("source") == "given":
        text = sd.w("story.between_given", sd=num(b.get("sd_pct") or 0.0, 1))
    else:
        text = sd.w("story.between_not_measured")
    return " ".join([how, text, *([link(sd, "verdicts")] if with_link else [])])


def verdict_table(sd: StudyData) -> Any:
    """Every comparison (A/A repeats included) level by level on the level's lead metric (a single
    request's decode speed at one request in flight, aggregate tok/s with more: `analysis.verdicts.lead_metric`):
    its change with the 95 % interval, the MDE, the verdict and the rounds (starts) behind it; the
    other throughput metric's and TTFT p50's change and verdict beside it."""
    agg = rows(sd)
    if agg.empty:
        return None
    by = {m: rows(sd, m).set_index(["configuration", "level"]) for m in (verdicts.DECODE, verdicts.PRIMARY, "ttft_p50_s")}
    target = num(load(sd)["model"]["mde_target"] * 100, 0)
    lab, cols = sd.labels(), [c.format(target=target) for c in sd.w("verdicts.columns")]

    def side(metric: str, key: tuple[str, str], named: bool = True) -> str:
        t = by[metric].loc[key] if key in by[metric].index else None
        if t is None or not math.isfinite(t["effect"]):
            return html.MISSING
        text = f"{pct(_p(t['effect']))} ({sd.w('verdict.' + verdict_key(t['verdict']))})"
        return f"{sd.w('verdicts.metric.' + metric)} {text}" if named else text

    out = []
    for key in zip(agg["configuration"], agg["level"]):
        a = by[verdicts.PRIMARY].loc[key]
        metric = verdicts.lead_metric(a["concurrency"])
        if key not in by[metric].index:
            metric = verdicts.PRIMARY
        x = by[metric].loc[key]
        other = verdicts.PRIMARY if metric == verdicts.DECODE else verdicts.DECODE
        ci = x["ci"] if isinstance(x["ci"], list) else [math.nan, math.nan]
        out.append([f"{lab.get(x['baseline'], x['baseline'])} → {lab.get(key[0], key[0])}" + (" (A/A)" if x["aa"] else ""),
                    key[1], sd.w("verdicts.metric." + metric), pct(_p(x["effect"])),
                    sd.w("story.range", lo=pct(_p(ci[0])), hi=pct(_p(ci[1]))), f"±{num(_p(x['mde']), 0)} %",
                    sd.w(f"verdict.{verdict_key(x['verdict'])}"),
                    sd.w("verdicts.rounds", n=int(x["rounds"] or 0), b=int(x["baseline_rounds"] or 0),
                         s=int(x["starts"] or 0), bs=int(x["baseline_starts"] or 0)),
                    sd.w(f"verdicts.stopped.{x['stopped']}") if isinstance(x.get("stopped"), str) else html.MISSING,
                    _to_target(sd, x), side(other, key), side("ttft_p50_s", key, named=False)])
    return html.table(pd.DataFrame(out, columns=cols), sd.w("verdicts.caption"),
                    notes={html.MISSING: sd.w("verdicts.dash")})


def _to_target(sd: StudyData, x: Any) -> str:
    """What would bring a comparison's MDE to the target: rounds per start (extrapolated), "more
    starts" when the variance between starts alone keeps it above, or – when it is there (or the
    change was found)."""
    n = x["rounds_for_target"]
    if x["verdict"] in (verdicts.FASTER, verdicts.SLOWER) or n is None or (isinstance(n, float) and math.isnan(n)):
        return html.MISSING
    if math.isinf(n):
        return sd.w("verdicts.more_starts")
    return sd.w("verdicts.rounds_needed", n=int(math.ceil(n)))


def _round_stats(sd: StudyData, key: str) -> list[float]:
    """One client_stats.jsonl figure over every measured round of every configuration."""
    from ..runfolder import CLIENT_STATS, read_jsonl

    return [float(s[key]) for f in sd.folders.values() for s in read_jsonl(f.path / CLIENT_STATS)
            if not s.get("warmup") and s.get(key) is not None]


def neighbour_cpu_pct(sd: StudyData) -> tuple[float, float] | None:
    """(median, max) over measured rounds of the CPU the idle engines used together while one was
    measured, in percent of one core (client_stats.jsonl); None when no round recorded it."""
    vals = [x * 100 for x in _round_stats(sd, "neighbour_cpu_frac_sum")]
    return (float(pd.Series(vals).median()), float(max(vals))) if vals else None


def disturbance_text(sd: StudyData) -> str:
    """What disturbed the engine starts and the measured rounds and what was done about it: the windows
    in which other processes or the hypervisor took the CPU (design.json), the rounds measured again,
    those the estimator left out (verdicts.json's `left_out`); or how quiet the rounds were."""
    from datetime import datetime, timezone

    def hm(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")

    lv = sd.design.levels
    n, again = sum(x.disturbed for x in lv), sum(x.remeasured for x in lv)
    out = []
    starts = sd.design.launch.windows if sd.design.launch else []
    if starts:
        lab = sd.labels()
        out.append(sd.w("verdicts.launch_disturbed", when=sd.w("story.list_sep").join(
            sd.w("verdicts.launch_window", t0=hm(w["from"]), t1=hm(w["to"]), cpu=num(w["busy_cpu"], 1),
                 starts=sd.w("story.count_sep").join(lab.get(c, c) for c in w.get("starts", [])) or html.MISSING) for w in starts)))
    if n:
        wins = [w for x in lv for w in x.windows]
        # a window that the machine rule did not flag is one of rounds far slower than their engine's
        # others that were not as slow measured again ("up to 0.0 cores" said nothing); windows recorded
        # before `machine_rounds` read as before
        when = sd.w("story.list_sep").join(
            sd.w("verdicts.window" if w.get("machine_rounds", 1) else "verdicts.window_slow", t0=hm(w["from"]),
                 t1=hm(w["to"]), rounds=w["rounds"], starts=len(w["starts"]), cpu=num(w["busy_cpu"], 1)) for w in wins)
        out.append(sd.w("verdicts.disturbed", n=n, again=again, when=when or html.MISSING,
                        s=num(sum(x.remeasure_s for x in lv), 0), waited=num(sum(x.waited_s for x in lv), 0)))
        credited = sum(x.credited_s for x in lv)
        if credited >= 0.5:
            out[-1] += " " + sd.w("verdicts.credited", s=num(credited, 0))
    else:
        busy = [a + b for a, b in zip(_round_stats(sd, "foreign_cpu"), _round_stats(sd, "steal_cpu"))]
        if busy:
            out.append(sd.w("verdicts.quiet", med=num(float(pd.Series(busy).median()), 2), most=num(max(busy), 2)))
    r = rows(sd)
    left = int(r.loc[~r["aa"].astype(bool), "left_out"].fillna(0).sum()) if "left_out" in r and len(r) else 0
    if left:
        out.append(sd.w("verdicts.left_out", n=left))
    return " ".join(out)


def verdicts_text(sd: StudyData) -> str:
    """The verdict section's paragraphs (Markdown): the model and the sampling rule the study ran
    with; then how far the MDEs are from the target and what would reach it."""
    d = load(sd).get("design") or {}
    first = d.get("first_rounds") or sd.study.workload.rounds
    if d.get("budget_s"):
        # studies measured before 2026-12-05 stopped a comparison on a clear interim verdict too
        rule = {"mde-borrow-then-budget": "verdicts.sampling_borrow", "mde-then-budget": "verdicts.sampling_fine",
                "mde": "verdicts.sampling"}.get(sd.design.sampling_rule or "", "verdicts.sampling_interim")
        target = float(load(sd)["model"]["mde_target"])
        sampling = sd.w(rule, first=first, target=f"{num(target * 100, 0)} %",
                        aim=f"{num(target * verdicts.SAMPLING_AIM * 100, 0)} %",
                        fine=f"{num(target * verdicts.FINE_AIM * 100, 0)} %",
                        most=d.get("max_rounds"), budget=num(d["budget_s"], 0))
        lent = [sd.w("verdicts.borrowed_level", label=x.label, s=num(x.borrowed_s, 0))
                for x in sd.design.levels if x.borrowed_s >= 0.5]
        if lent:
            sampling += " " + sd.w("verdicts.borrowed", levels=", ".join(lent))
    else:
        sampling = sd.w("verdicts.fixed", first=first)
    out = sd.w("verdicts.text", sampling=sampling) + " " + model_sentence(sd, with_link=False)
    phys = physics_text(sd)
    if phys:  # before anything else: a level faster than physics is not a speed
        out = phys + "\n\n" + out
    cpu = neighbour_cpu_pct(sd)
    if cpu is not None:
        out += " " + sd.w("verdicts.neighbours", med=num(cpu[0], 1), most=num(cpu[1], 1))
    dist = disturbance_text(sd)
    if dist:  # its own paragraph (Markdown)
        out += "\n\n" + dist
    warm = warming_text(sd)
    if warm:  # its own paragraph (Markdown)
        out += "\n\n" + warm
    plan = load(sd).get("to_target")
    if plan:  # its own paragraph (Markdown)
        out += "\n\n" + to_target_text(sd, plan)
    return out


def physics_text(sd: StudyData) -> str:
    """The levels measured faster than physics allows (verdicts.json `physics`), each with its floor and the
    likely causes; "" when none was."""
    ph = load(sd).get("physics") or {}
    flags = ph.get("flags") or []
    if not flags:
        return ""
    lab = sd.labels()
    items = []
    for f in flags:
        what = (sd.w("physics.tpot_floor", gb=num(f["bytes"] / 1e9, 1),
                     experts=(sd.w("physics.experts", n=num(f["experts_touched"], 1), of=f["experts"])
                              if f.get("experts") else ""))
                if f["metric"] == "tpot" else sd.w("physics.ttft_floor", tflop=num(f["flops"] / 1e12, 1)))
        causes = sd.w("story.list_sep").join(
            sd.w(f"physics.cause.{c['cause']}") + sd.w("physics.because", why=sd.w(f"physics.say.{c['say']}", **c["values"]))
            for c in f["causes"])
        items.append(sd.w("physics.item", config=lab.get(f["config"], f["config"]), level=f["level"],
                          metric=sd.w(f"physics.metric.{f['metric']}"), measured=num(f["measured_s"] * 1e3, 2),
                          floor=num(f["floor_s"] * 1e3, 2), what=what, causes=causes))
    return sd.w("physics.head", n=len(flags)) + "\n\n" + "\n".join(f"- {i}" for i in items)


def warming_text(sd: StudyData) -> str:
    """The levels measured while the server was still warming up (verdicts.json `warming`), each with its TTFTs in
    order, those the runner measured again for it (`warming_measured_again`), and those whose speed changed partway
    through (`speed_step`); "" when none."""
    v = load(sd)
    lab = sd.labels()

    def ms(ts: list[float]) -> str:
        return ", ".join(num(t * 1e3, 1) for t in ts)
    parts = []
    if v.get("warming"):
        items = [sd.w("warming.item", config=lab.get(x["config"], x["config"]), bucket=x["bucket"], ttfts=ms(x["ttft_s"]))
                 for x in v["warming"]]
        parts.append(sd.w("warming.head", n=len(items)) + "\n\n" + "\n".join(f"- {i}" for i in items))
    if v.get("warming_measured_again"):
        items = [sd.w("warming.again_item", config=lab.get(x["config"], x["config"]), bucket=x["bucket"],
                      first=ms(x["first_ttft_s"]), again=ms(x["ttft_s"])) for x in v["warming_measured_again"]]
        parts.append(sd.w("warming.again_head", n=len(items)) + "\n\n" + "\n".join(f"- {i}" for i in items))
    if v.get("speed_step"):
        items = [sd.w("warming.step_item", config=lab.get(x["config"], x["config"]), bucket=x["bucket"],
                      ttfts=ms(x["ttft_s"]), before=num(x["before_s"] * 1e3, 1), after=num(x["after_s"] * 1e3, 1))
                 for x in v["speed_step"]]
        parts.append(sd.w("warming.step_head", n=len(items)) + "\n\n" + "\n".join(f"- {i}" for i in items))
    return "\n\n".join(parts)


def physics_note(sd: StudyData, config: str, bucket: str, concurrency: float) -> str:
    """A sentence for a headline figure whose level ran faster than physics allows (verdicts.json `physics`): its
    likely causes and that it is no speed this configuration would give; "" for a level not flagged."""
    for f in (load(sd).get("physics") or {}).get("flags") or []:
        if (f.get("config"), f.get("bucket")) == (config, bucket) and float(f.get("concurrency") or 0) == float(concurrency):
            causes = sd.w("story.list_sep").join(sd.w(f"physics.cause.{c['cause']}") for c in f["causes"])
            return sd.w("story.physics_flagged", causes=causes) + " " + link(sd, "verdicts")
    return ""


def to_target_text(sd: StudyData, plan: dict[str, Any]) -> str:
    """Where the MDE target was not met: how many change levels met it, the largest MDE, why (the
    variance between starts or too few rounds) and what measurement would reach it (verdicts.json
    `to_target`)."""
    lab = sd.labels()
    w = plan["worst"]
    out = sd.w("verdicts.target_met", met=plan["met"], rows=plan["rows"], target=f"{num(plan['target'] * 100, 0)} %",
               mde=f"{num(w['mde'] * 100, 0)} %", config=lab.get(w["configuration"], w["configuration"]), level=w["level"])
    if plan["met"] == plan["rows"]:
        return out
    floor = plan.get("between_floor_mde") or 0.0
    out += " " + (sd.w("verdicts.target_starts", floor=f"{num(floor * 100, 0)} %") if floor > plan["target"]
                  else sd.w("verdicts.target_rounds") if plan.get("between_starts") != "not measured"
                  else sd.w("verdicts.target_rounds_unmeasured"))
    if plan.get("reached"):
        out += " " + sd.w("verdicts.target_plan", starts=plan["starts"], rounds=plan["rounds"],
                          took=minutes(sd, plan["seconds"]), now=minutes(sd, plan.get("now_seconds") or 0.0))
    else:
        out += " " + sd.w("verdicts.target_unreached")
    return out


def _p(x: Any) -> float:
    try:
        return float(x) * 100.0
    except (TypeError, ValueError):
        return math.nan


def verdict_key(verdict: Any) -> str:
    return {verdicts.FASTER: "faster", verdicts.SLOWER: "slower", verdicts.NO_CHANGE: "none"}.get(verdict, "undetermined")
