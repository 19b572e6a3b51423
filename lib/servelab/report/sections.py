"""The write-up's story sections, each computed from a `StudyData`: the headline (3-5 sentences
that say what was learned, each pointing to its section), the set-up, the method, one results
table per configuration, the one-change-at-a-time progression and the reproducibility cards.
Tables come back as reading-ready HTML (`report.html.table`); prose as Markdown strings.
"""

from __future__ import annotations

import shlex
from typing import Any

import pandas as pd

from ..analysis import flatten
from ..schema.runfiles import RunInfo
from ..summary import DEFINED_METRICS
from . import attached, html
from .attached import engine_not_started_text, not_started  # noqa: F401  (the notebooks' sec.engine_not_started_text)
from .accuracy import reference_text  # noqa: F401  (the notebooks' sec.reference_text)
from .checks import checks_of
from .fmt import anchor, dash_note, link, num, pct, slo_parts, span  # noqa: F401  (the notebooks' sec.anchor etc.)
from .load import StudyData, baselines, engine_gpus, engine_layout
# the headline (3-6 sentences, each pointing to its section), what changed (one lever per item) and the
# progression (one row per change, judged level by level) are report.progress's; the notebooks call them sec.*
from .progress import change_text, headline, layout_name, method_text_prompt_sets, progression_table  # noqa: F401
from .verdicts import verdict_table, verdicts_text  # noqa: F401  (the notebooks' sec.verdicts_text, sec.verdict_table)
from .workload import extra_definitions


# -- set-up and method -------------------------------------------------------------------------

def config_table(sd: StudyData) -> Any:
    """One row per configuration: label, engine and version, baseline and what changed."""
    w, bases, rows = sd.w, baselines(sd), []
    cols = sd.w("configs.columns")
    for c in sd.study.configurations:
        if c.id not in sd.folders:
            done = checks_of(sd, c.id)
            rows.append([c.id, c.label or c.id, html.MISSING, c.baseline or html.MISSING,
                         w("checks.checks_only", checks=", ".join(done)) if done else w("configs.not_measured")])
            continue
        run = sd.info(c.id)
        eng = f"{run.engine_kind or '?'} {run.server.version or ''}".strip()
        base = bases.get(c.id)
        rows.append([c.id, c.label or c.id, eng, base or w("configs.baseline"),
                     change_text(sd, c.id, base) if base else w("configs.baseline")])
    return html.table(pd.DataFrame(rows, columns=cols), w("configs.caption"))


def fixed_settings(sd: StudyData) -> Any:
    """Engine settings every configuration shares and that are set (no empty values)."""
    settings = [flatten(sd.engine_params(c)) for c in sd.config_ids if c not in not_started(sd)]  # none known of those
    if not settings:
        return None
    skip = ("host", "port", "startup_timeout_s")
    keys = [k for k, v in settings[0].items() if v not in (None, {}, [], "")
            and all(s.get(k) == v for s in settings) and k.split(".")[0] not in skip]
    cols = sd.w("fixed.columns")
    return html.table(pd.DataFrame([[k, str(settings[0][k])] for k in keys], columns=cols), sd.w("fixed.caption"))


def method_text(sd: StudyData) -> str:
    wl = sd.study.workload
    if any(b.prompt_set for b in wl.buckets):
        return method_text_prompt_sets(sd)
    first = next(iter(sd.runs.values()), {})
    cal = first.get("calibration", {})
    counter = next(iter(cal.values()), {}).get("counter", "the server's /tokenize")
    achieved = ", ".join(f"{v['target_tokens']:,} → {v['tokens']:,}" for v in cal.values()
                         if "target_tokens" in v) or html.MISSING
    api = "/v1/chat/completions" if wl.api == "chat" else "/v1/completions"
    text = sd.w("method.body", api=api, temperature=wl.temperature, seed=wl.seed, prompt_text=wl.prompt_text,
                counter=counter, calibration=achieved, warmup=wl.warmup_rounds, rounds=wl.rounds,
                k=wl.requests_per_round, salt=sd.w("method.salt_on") if wl.cache_salt else sd.w("method.salt_off"))
    recs = sd.records
    if "output_tokens_source" in recs and (recs["output_tokens_source"] == "client").any():
        n = int((recs["output_tokens_source"] == "client").sum())
        text += " " + sd.w("tokens.client_counted", n=f"{n:,}", total=f"{len(recs):,}", counter=counter)
    return text


def definitions_table(sd: StudyData) -> Any:
    cols = sd.w("definitions.columns")
    rows = [(m, sd.w(f"definition.{m}")) for m in DEFINED_METRICS] + extra_definitions(sd)
    return html.table(pd.DataFrame(rows, columns=cols), sd.w("definitions.caption"))


def sessions_text(sd: StudyData) -> str:
    """Where and when a GPU study ran: the machine's GPUs, the host's cores and the date, from design.json's
    placement (the study runner's record), or the sessions study.json recorded for a study measured before it;
    '' for a study on the CPU (its machine is in the reproducibility card)."""
    lines = []
    placed = sd.design.placement or {}
    if placed.get("machine"):
        gpus: dict[str, int] = {}
        for g in placed["machine"]:
            mem = f" ({g['total_bytes'] / 2**30:.0f} GiB)" if g.get("total_bytes") else ""
            gpus[f"{g['name']}{mem}"] = gpus.get(f"{g['name']}{mem}", 0) + 1
        host = next((sd.info(c).client_host for c in sd.config_ids), None)
        planned = list((placed.get("servers") or {}).values())
        servers = [f"{', '.join(s['configs'])} (GPU {','.join(map(str, s['gpus']))})"
                   for s in planned if set(s["configs"]) & set(sd.config_ids)]  # servers that measured something
        unmeasured = [c for s in planned for c in s["configs"] if c not in sd.config_ids]
        shared = any(len(g) > 1 for phase in placed.get("phases") or [] for lane in phase for g in lane["groups"])
        lines.append("- " + sd.w("setup.placement_shared" if shared else "setup.placement", gpus=", ".join(f"{n} x {name}" for name, n in gpus.items()),
                                 cores=(host.cpu_count if host else None) or "?",
                                 date=str(sd.design.started_at or next((sd.info(c).started_at for c in sd.config_ids),
                                                                       "") or "")[:10],
                                 servers=html.quote_md("; ".join(servers), sd.language))
                     + (sd.w("setup.not_measured", configs=html.quote_md(", ".join(unmeasured), sd.language))
                        if unmeasured else ""))
    for d in sd.meta.get("sessions") or []:
        lines.append("- " + sd.w("setup.session", machine=html.quote_md(d.get("machine"), sd.language),
                                 date=d.get("date"), configs=html.quote_md(d.get("configurations"), sd.language) or "–"))
    return "\n".join(lines)


# -- results ----------------------------------------------------------------------------------



def results_table(sd: StudyData, cid: str) -> Any:
    """One configuration's levels: rows by prompt length and concurrency, at most 8 columns."""
    s = sd.summary[sd.summary["config"] == cid].sort_values(["target_input_tokens", "concurrency"])
    rows = [[_level_name(r), _load(r), r.ttft_p50_s * 1000, r.ttft_p95_s * 1000, r.decode_tps_p50,
             r.e2e_output_tps_p50, r.aggregate_output_tps,
             span(r.aggregate_output_tps_min, r.aggregate_output_tps_max)] for r in _named(s).itertuples()]
    c = sd.w("results.columns")
    t = pd.DataFrame(rows, columns=c)
    return html.table(t, sd.w("results.caption", label=sd.labels().get(cid, cid)),
                    formats={c[0]: lambda v: v if isinstance(v, str) else f"{v:,.0f}", c[2]: "{:,.1f}", c[3]: "{:,.1f}", c[4]: "{:,.1f}", c[5]: "{:,.1f}",
                             c[6]: "{:,.1f}"},
                    notes=dash_note(t, sd.w("table.not_measured_at_level")))


def _named(s: pd.DataFrame) -> pd.DataFrame:
    """The summary rows with the name a row needs besides its prompt tokens: the prompt set, or the
    bucket where the lengths come with the requests (a trace: target 0), grow with them (a
    session resends its history) or two buckets share a target length and concurrency (0 % and
    50 % prefix reuse at 256 tokens)."""
    s = s.copy()
    target = pd.to_numeric(s["target_input_tokens"], errors="coerce").fillna(0)
    achieved = pd.to_numeric(s["prompt_tokens"], errors="coerce")
    ambiguous = (s.duplicated(["target_input_tokens", "concurrency"], keep=False) | (target == 0)
                 | ((achieved - target).abs() > 0.1 * target))
    sets = s["prompt_set"].fillna("").astype(str) if "prompt_set" in s.columns else pd.Series("", index=s.index)
    s["row_name"] = [ps or (str(b) if amb else "") for ps, b, amb in zip(sets, s["bucket"], ambiguous)]
    return s


def _level_name(r: Any) -> Any:
    return f"{r.row_name} · {r.prompt_tokens:,.0f}" if r.row_name else r.prompt_tokens


def _load(r: Any) -> Any:
    """The concurrency, or for an open-loop level (its concurrency only caps what is in flight) the rate."""
    rate = float(getattr(r, "rate_rps", 0) or 0)
    return f"{rate:.3g} req/s" if rate > 0 else int(r.concurrency)


# -- reproducibility ------------------------------------------------------------------------------

def _revision(sd: StudyData, run: RunInfo) -> str:
    if run.model and run.model.revision:
        return run.model.revision
    if run.load_format == "dummy":
        return sd.w("repro.dummy_weights")
    return sd.w("repro.not_recorded")


def _servelab(sd: StudyData, run: RunInfo) -> str:
    s = run.servelab
    out = (sd.w("repro.servelab_commit", version=s.version, commit=s.commit[:12]) if s.commit
           else sd.w("repro.servelab_no_commit", version=s.version))
    if s.dirty:
        out += sd.w("repro.local_changes")
    if s.package_sha256:
        out += sd.w("repro.package_sha256", sha=s.package_sha256)
    return out


def _hardware(sd: StudyData, cid: str) -> str:
    run = sd.info(cid)
    host, used = run.client_host, run.gpus_used
    if used:
        names = sorted({g["name"] for g in used})
        return f"{len(used)} × {', '.join(names)}"
    if host.gpus:
        return f"{engine_gpus(sd, cid)} × {host.gpus[0]['name']}"
    return sd.w("repro.cpu", model=host.cpu_model, count=host.cpu_count)


def _layout(sd: StudyData, cid: str) -> str:
    """The parallel layout, with its GPU count where the run had GPUs ("TP=1" alone on a CPU)."""
    run, lay = sd.info(cid), engine_layout(sd, cid)
    return layout_name(sd, lay) if run.gpus_used or run.client_host.gpus else lay.label()


def _card_rows(sd: StudyData, cid: str) -> dict[str, str]:
    """The card's short fields, each named in the page's language."""
    r = sd.info(cid)
    srv, facts = r.server, sd.facts(cid)
    args = r.engine_params.args if r.engine_params else {}
    w = sd.w
    status = w("repro.status", status=r.status, records=num(r.records, 0))
    if r.headline.success_rate is not None:
        status += w("repro.success", pct=r.headline.success_rate * 100)
    unknown = attached.unknown(sd, cid)  # an engine servelab did not start: its model, flags and start-up
    return {
        w("repro.field.model"): unknown or w("repro.model", architecture=facts.get("architecture", "?"),
                                             params=num(facts.get("param_count", 0) / 1e6, 1),
                                             dtype=facts.get("dtype", "?"), weights=r.load_format or w("repro.checkpoint")),
        w("repro.field.revision"): unknown or _revision(sd, r),
        w("repro.field.engine"): f"{r.engine_kind} {srv.version or w('repro.version_not_recorded')}",
        w("repro.field.hardware"): unknown or _hardware(sd, cid),
        w("repro.field.precision"): unknown or f"{args.get('dtype', 'auto')} / {args.get('kv-cache-dtype', 'auto')}",
        w("repro.field.parallel"): unknown or _layout(sd, cid),
        w("repro.field.startup"): w("repro.startup", s=srv.startup_s) if srv.startup_s
        else unknown or w("repro.not_recorded"),
        w("repro.field.run"): f"{r.started_at} → {r.finished_at}",
        w("repro.field.status"): status,
        w("repro.field.servelab"): _servelab(sd, r),
    }


def _long_values(sd: StudyData, cid: str) -> dict[str, str]:
    """The card's long values (launch command, environment, packages, client host), for <details>."""
    r, w = sd.info(cid), sd.w
    srv, host = r.server, r.client_host
    cmd, env = srv.command, srv.env or {}
    unknown = attached.unknown(sd, cid)  # an engine servelab did not start: its environment and packages
    return {w("repro.long.command"): shlex.join(cmd) if cmd else srv.base_url or w("repro.not_recorded"),
            w("repro.long.environment"): unknown or " ".join(f"{k}={v}" for k, v in env.items()) or w("repro.none_recorded"),
            w("repro.long.packages"): unknown or ", ".join(f"{k} {v}" for k, v in r.packages.items())
            or w("repro.not_recorded"),
            w("repro.long.client_host"): w("repro.client_host", cpu=host.cpu_model, count=host.cpu_count,
                                           python=host.python)}


def repro_cards(sd: StudyData) -> list[Any]:
    """A compact card per configuration (the reproducibility record, `run.json`); long values in <details>."""
    out = []
    for cid in sd.config_ids:
        out.append(html.card(f"{sd.labels().get(cid, cid)} ({cid})", _card_rows(sd, cid)))
        out.append(html.details(sd.w("repro.details", config=cid),
                              "\n\n".join(f"{k}:\n{v}" for k, v in _long_values(sd, cid).items())))
    return out
