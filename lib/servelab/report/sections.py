"""The write-up's story sections, each computed from a `StudyData`: the headline (3-5 sentences
that say what was learned, each pointing to its section), the set-up, the method, one results
table per configuration, the one-change-at-a-time progression and the reproducibility cards.
Tables come back as reading-ready HTML (`report.html.table`); prose as Markdown strings.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

import pandas as pd

from ..analysis import change_effects, config_diff, flatten, goodput, knee
from ..summary import DEFINITIONS
from . import html as rh
from .load import StudyData, baselines, engine_gpus


def num(x: Any, nd: int | None = None) -> str:
    """A number for prose: thousands separators; `nd` decimals (default by magnitude)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return rh.MISSING
    if nd is None:
        return rh.format_number(x)
    return f"{x:,.{nd}f}"


def pct(x: float) -> str:
    return rh.MISSING if not math.isfinite(x) else f"{x:+.1f} %"


def anchor(key: str, title: str, level: int = 2) -> str:
    """A heading with a stable anchor (the same in both languages), for the headline's links."""
    return f'<a id="{key}"></a>\n\n{"#" * level} {title}'


def link(sd: StudyData, key: str) -> str:
    return f"([{sd.w('see')}: {sd.w(key)}](#{key}))"


def slo_parts(sd: StudyData) -> str:
    slo = sd.study.slo
    parts = []
    if slo.ttft_p95_s:
        parts.append(f"p95 TTFT ≤ {slo.ttft_p95_s * 1000:,.0f} ms")
    if slo.tpot_p95_s:
        parts.append(f"p95 TPOT ≤ {slo.tpot_p95_s * 1000:,.0f} ms")
    parts.append(f"error rate ≤ {slo.error_rate * 100:.1f} %")
    return ", ".join(parts)


def change_text(sd: StudyData, cid: str, base: str) -> str:
    diffs = config_diff(sd.engine_params(base), sd.engine_params(cid))
    if not diffs:
        return sd.w("no_change")
    return "; ".join(f"{k}: {_short(a)} → {_short(b)}" for k, a, b in diffs)


def _short(v: Any) -> str:
    return "–" if v is None else str(v)


def dash_note(df: pd.DataFrame, text: str) -> dict[str, str] | None:
    """The en-dash footnote, only when a cell of `df` is missing."""
    return {rh.MISSING: text} if df.isna().to_numpy().any() or (df == rh.MISSING).to_numpy().any() else None


def span(lo: float, hi: float) -> str:
    nd = 0 if min(abs(lo), abs(hi)) >= 100 else 1
    return f"{num(lo, nd)}–{num(hi, nd)}"


def effects(sd: StudyData) -> pd.DataFrame:
    return change_effects(sd.summary, sd.rounds, baselines(sd))


# -- headline -----------------------------------------------------------------------------------

def headline(sd: StudyData) -> str:
    """3-5 sentences computed from the data, each pointing to its section."""
    s = sd.summary
    if s.empty:
        return "–"
    lab = sd.labels()
    out = []
    best = s.loc[s["aggregate_output_tps"].idxmax()]
    out.append(sd.w("h_best", label=lab.get(best["config"], best["config"]), peak=num(best["aggregate_output_tps"], 0),
                    bucket=best["bucket"], conc=int(best["concurrency"])) + " " + link(sd, "results"))
    eff = effects(sd).dropna(subset=["agg_change_pct"])  # open-loop levels share no (bucket, concurrency)
    if len(eff):
        e = eff.loc[eff["agg_change_pct"].abs().idxmax()]
        out.append(sd.w("h_change", config=lab.get(e["config"], e["config"]), baseline=e["baseline"],
                        what=change_text(sd, e["config"], e["baseline"]), delta=pct(e["agg_change_pct"]),
                        n=int(e["levels"]), lo=pct(e["agg_ci_low_pct"]), hi=pct(e["agg_ci_high_pct"]),
                        noise=sd.w("beyond_noise") if e["beyond_noise"] else sd.w("within_noise"))
                   + " " + link(sd, "progression"))
    kn = knee(s)
    kn = kn[kn["top_concurrency"] == kn["top_concurrency"].max()]  # the widest sweep says most
    plateau = kn[kn["plateau"]].sort_values("knee_concurrency")
    fastest = kn[kn["config"] == best["config"]]
    pick = plateau if len(plateau) else (fastest if len(fastest) else kn)
    if len(pick):
        r = pick.iloc[0]
        if r["plateau"]:
            out.append(sd.w("h_saturation", label=lab.get(r["config"], r["config"]), bucket=r["bucket"],
                            conc=int(r["knee_concurrency"])) + " " + link(sd, "saturation"))
        else:
            out.append(sd.w("h_no_saturation", label=lab.get(r["config"], r["config"]), bucket=r["bucket"],
                            conc=int(r["top_concurrency"])) + " " + link(sd, "saturation"))
    g = goodput(s, sd.study.slo).dropna(subset=["goodput_concurrency"])
    if len(g):
        r = g.loc[g["aggregate_output_tps"].idxmax()]
        out.append(sd.w("h_goodput", slo=slo_parts(sd), tps=num(r["aggregate_output_tps"], 0),
                        conc=int(r["goodput_concurrency"]), label=lab.get(r["config"], r["config"]), bucket=r["bucket"])
                   + " " + link(sd, "saturation"))
    else:
        out.append(sd.w("h_no_goodput", slo=slo_parts(sd)) + " " + link(sd, "saturation"))
    from ..analysis import kv_verdict

    limited = [lab.get(c, c) for c in sd.config_ids
               if sd.samples(c) is not None and kv_verdict(sd.samples(c))["limited"]]
    if limited:
        out.append(sd.w("h_kv", configs=", ".join(limited)) + " " + link(sd, "kv"))
    from .gpu import engine_comparison_table

    cmp_ = engine_comparison_table(sd)
    if len(cmp_):
        ref = cmp_["reference"].iloc[0]
        other = cmp_[cmp_["engine"] != cmp_.loc[cmp_["config"] == ref, "engine"].iloc[0]]  # the other engine's
        best = other.groupby("config", sort=False)["aggregate_vs_reference"].median().idxmax()
        r = other[other["config"] == best]["aggregate_vs_reference"]
        out.append(sd.w("h_engines", other=lab.get(best, best), ref=lab.get(ref, ref), n=len(r),
                        lo=pct((r.min() - 1) * 100), hi=pct((r.max() - 1) * 100)) + " " + link(sd, "gpu"))
    from .money import cost_sentence

    out.append(cost_sentence(sd) + " " + link(sd, "cost"))
    return "\n".join(f"- {x}" for x in out)


# -- set-up and method -------------------------------------------------------------------------

def config_table(sd: StudyData) -> Any:
    """One row per configuration: label, engine and version, baseline and what changed."""
    w, bases, rows = sd.w, baselines(sd), []
    cols = sd.w("sections_147")
    for c in sd.study.configurations:
        if c.id not in sd.folders:
            from .checks import checks_of

            done = checks_of(sd, c.id)
            rows.append([c.id, c.label or c.id, rh.MISSING, c.baseline or rh.MISSING,
                         w("checks.checks_only", checks=", ".join(done)) if done else w("not_measured")])
            continue
        run = sd.runs[c.id]
        eng = f"{(run.get('engine_params') or {}).get('kind', '?')} {run.get('server', {}).get('version') or ''}".strip()
        base = bases.get(c.id)
        rows.append([c.id, c.label or c.id, eng, base or w("baseline"),
                     change_text(sd, c.id, base) if base else w("baseline")])
    return rh.table(pd.DataFrame(rows, columns=cols), w("t_configs"))


def fixed_settings(sd: StudyData) -> Any:
    """Engine settings every configuration shares and that are set (no empty values)."""
    settings = [flatten(sd.engine_params(c)) for c in sd.config_ids]
    if not settings:
        return None
    skip = ("host", "port", "startup_timeout_s")
    keys = [k for k, v in settings[0].items() if v not in (None, {}, [], "")
            and all(s.get(k) == v for s in settings) and k.split(".")[0] not in skip]
    cols = sd.w("sections_169")
    return rh.table(pd.DataFrame([[k, str(settings[0][k])] for k in keys], columns=cols), sd.w("t_fixed"))


def method_text(sd: StudyData) -> str:
    wl = sd.study.workload
    first = next(iter(sd.runs.values()), {})
    cal = first.get("calibration", {})
    counter = next(iter(cal.values()), {}).get("counter", "the server's /tokenize")
    achieved = ", ".join(f"{v['target_tokens']:,} → {v['tokens']:,}" for v in cal.values()) or rh.MISSING
    api = "/v1/chat/completions" if wl.api == "chat" else "/v1/completions"
    return sd.w("method_body", api=api, temperature=wl.temperature, seed=wl.seed, prompt_text=wl.prompt_text,
                counter=counter, calibration=achieved, warmup=wl.warmup_rounds, rounds=wl.rounds,
                k=wl.requests_per_round, salt=sd.w("salt_on") if wl.cache_salt else sd.w("salt_off"))


def definitions_table(sd: StudyData) -> Any:
    cols = sd.w("sections_186")
    return rh.table(pd.DataFrame(list(DEFINITIONS.items()), columns=cols), sd.w("t_definitions"))


def devices_text(sd: StudyData) -> str:
    lines = []
    for d in sd.meta.get("device") or []:
        lines.append("- " + sd.w("devices", kind=d.get("kind"), machine=d.get("machine"), date=d.get("date"),
                                 minutes=f"{d.get('held_s', 0) / 60:.1f}", configs=d.get("configurations") or "–"))
    return "\n".join(lines)


# -- results ----------------------------------------------------------------------------------



def results_table(sd: StudyData, cid: str) -> Any:
    """One configuration's levels: rows by prompt length and concurrency, at most 8 columns."""
    s = sd.summary[sd.summary["config"] == cid].sort_values(["target_input_tokens", "concurrency"])
    rows = [[r.prompt_tokens, int(r.concurrency), r.ttft_p50_s * 1000, r.ttft_p95_s * 1000, r.decode_tps_p50,
             r.e2e_output_tps_p50, r.aggregate_output_tps,
             span(r.aggregate_output_tps_min, r.aggregate_output_tps_max)] for r in s.itertuples()]
    c = sd.w("results_columns")
    t = pd.DataFrame(rows, columns=c)
    return rh.table(t, sd.w("t_results", label=sd.labels().get(cid, cid)),
                    formats={c[0]: "{:,.0f}", c[2]: "{:,.1f}", c[3]: "{:,.1f}", c[4]: "{:,.1f}", c[5]: "{:,.1f}",
                             c[6]: "{:,.1f}"},
                    notes=dash_note(t, sd.w("dash_not_measured")))


def progression_table(sd: StudyData) -> Any:
    """One row per change: from -> to, what changed, the levels compared, the median change in
    aggregate tok/s with its bootstrap interval, the TTFT change and the noise verdict."""
    e = effects(sd)
    if e.empty:
        return None
    lab = sd.labels()
    cols = sd.w("sections_229")
    rows, multi = [], False
    for r in e.itertuples():
        n_changed = len(config_diff(sd.engine_params(r.baseline), sd.engine_params(r.config)))
        verdict = sd.w("beyond_noise") if r.beyond_noise else sd.w("within_noise")
        if n_changed > 1:
            verdict += " †"
            multi = True
        rows.append([f"{lab.get(r.baseline, r.baseline)} → {lab.get(r.config, r.config)}",
                     change_text(sd, r.config, r.baseline), r.levels, pct(r.agg_change_pct),
                     f"{pct(r.agg_ci_low_pct)} … {pct(r.agg_ci_high_pct)}".replace("…", "to" if sd.language == "en"
                                                                                     else "〜"),
                     pct(r.ttft_change_pct), verdict])
    note = sd.w("sections_243")
    return rh.table(pd.DataFrame(rows, columns=cols), sd.w("t_progression"), notes={"†": note} if multi else None)


# -- reproducibility ------------------------------------------------------------------------------

def _revision(run: dict[str, Any]) -> str:
    m = run.get("model") or {}
    if m.get("revision"):
        return m["revision"]
    if (run.get("engine_params") or {}).get("load_format") == "dummy":
        return "dummy weights (content hash not recorded)"
    return "not recorded"


def _servelab(run: dict[str, Any]) -> str:
    s = run.get("servelab") or {}
    commit = s.get("commit")
    out = f"{s.get('version')} @ {commit[:12]}" if commit else f"{s.get('version')}, commit not recorded"
    if s.get("dirty"):
        out += " (local changes)"
    if s.get("package_sha256"):
        out += f", package sha256 {s['package_sha256']}"
    return out


def _hardware(sd: StudyData, cid: str) -> str:
    run = sd.runs[cid]
    host = run.get("client_host") or {}
    used = run.get("gpus_used")
    if used:
        names = sorted({g["name"] for g in used})
        return f"{len(used)} × {', '.join(names)}"
    gpus = host.get("gpus") or []
    if gpus:
        return f"{engine_gpus(sd, cid)} × {gpus[0]['name']}"
    return f"CPU: {host.get('cpu_model')} × {host.get('cpu_count')}"


def repro_cards(sd: StudyData) -> list[Any]:
    """A compact card per configuration (seed 002's list); long values in <details>."""
    out = []
    for cid in sd.config_ids:
        r = sd.runs[cid]
        srv, eng, facts, hd = r.get("server", {}), r.get("engine_params", {}), sd.facts(cid), r.get("headline", {})
        args = eng.get("args") or {}
        rows = {
            "model": f"{facts.get('architecture', '?')}, {num(facts.get('param_count', 0) / 1e6, 1)} M params, "
                     f"{facts.get('dtype', '?')}; weights: {eng.get('load_format') or 'checkpoint'}",
            "model revision": _revision(r),
            "engine": f"{eng.get('kind')} {srv.get('version') or 'version not recorded'}",
            "hardware": _hardware(sd, cid),
            "precision / KV dtype": f"{args.get('dtype', 'auto')} / {args.get('kv-cache-dtype', 'auto')}",
            "parallel layout": f"TP={args.get('tensor-parallel-size', args.get('tp-size', 1))}",
            "startup": f"{srv['startup_s']:,.1f} s" if srv.get("startup_s") else "not recorded",
            "run": f"{r.get('started_at')} → {r.get('finished_at')}",
            "status": f"{r.get('status')}, {num(r.get('records'), 0)} records"
                      + (f", success {hd['success_rate'] * 100:.1f} %" if hd.get("success_rate") is not None else ""),
            "servelab": _servelab(r),
        }
        out.append(rh.card(f"{sd.labels().get(cid, cid)} ({cid})", rows))
        cmd = srv.get("command")
        env = srv.get("env") or {}
        long = {"launch command": shlex.join(cmd) if cmd else srv.get("base_url", "not recorded"),
                "engine environment": " ".join(f"{k}={v}" for k, v in env.items()) or "none recorded",
                "packages": ", ".join(f"{k} {v}" for k, v in (r.get("packages") or {}).items()) or "not recorded",
                "client host": f"{(r.get('client_host') or {}).get('cpu_model')} × "
                               f"{(r.get('client_host') or {}).get('cpu_count')}, Python "
                               f"{(r.get('client_host') or {}).get('python')}"}
        out.append(rh.details(f"{cid}: launch command, environment, packages",
                              "\n\n".join(f"{k}:\n{v}" for k, v in long.items())))
    return out
