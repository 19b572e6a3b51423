"""What a GPU study measured beside its workloads, in the write-up: the
real-weights checks (params `checks:`, measure.realchecks) -- the fp8 KV cache quality
check (each configuration's quality.json against its baseline's: identical outputs, first
divergence, task score) and n-gram speculative decoding (speculative.jsonl: output tok/s and the
deltas of vLLM's spec_decode counters per prompt set and concurrency) --, the capacity-at-SLO
searches (params `capacity_runs:`, run folders `<config>-capacity` with the search's result in
run.json), and the servers' start-up times (design.json's placement, or study.json `sessions[].startup_s`).
Pure functions of the published files."""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd
from IPython.display import Markdown

from ..analysis.capacity import capacity_result
from ..runfolder import CHECK_FILES, QUALITY_JSON, RECORDS, RUN_JSON, SPECULATIVE_JSONL
from . import html
from .capacity import ends_cell, fit_sentence
from .fmt import anchor
from .load import StudyData

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


def quality_of(sd: StudyData, cid: str) -> dict[str, Any] | None:
    return sd.file(QUALITY_JSON, cid)


def speculative_of(sd: StudyData, cid: str) -> list[dict[str, Any]]:
    return sd.file(SPECULATIVE_JSONL, cid) or []


def checks_of(sd: StudyData, cid: str) -> list[str]:
    """The check files a configuration published (its measurements when it ran no workload)."""
    return [f for f in CHECK_FILES if sd.file(f, cid) is not None]


def compare_quality(run_q: dict[str, Any], base_q: dict[str, Any]) -> dict[str, Any]:
    """Greedy outputs of one configuration against its baseline's, prompt by prompt (same ids):
    identical token ids, the first token index where they differ, and both task scores."""
    base = {(p["set"], p["id"]): p for p in base_q["prompts"]}
    pairs = [(p, base[(p["set"], p["id"])]) for p in run_q["prompts"] if (p["set"], p["id"]) in base]
    diverged = []
    for p, b in pairs:
        a, c = p["output_token_ids"], b["output_token_ids"]
        if a != c:
            i = next((k for k, (x, y) in enumerate(zip(a, c)) if x != y), min(len(a), len(c)))
            diverged.append({"id": p["id"], "set": p["set"], "token_index": i})
    same = len(pairs) - len(diverged)
    score = [run_q["score"]["correct"], run_q["score"]["total"]]
    base_score = [base_q["score"]["correct"], base_q["score"]["total"]]
    return {"measurable": bool(run_q.get("measurable") and base_q.get("measurable")), "identical": same,
            "total": len(pairs), "identical_share": same / len(pairs) if pairs else float("nan"),
            "first_divergence": diverged, "score": score, "baseline_score": base_score,
            "changed": bool(diverged), "score_dropped": score[0] < base_score[0]}


def _baseline(sd: StudyData, cid: str) -> str | None:
    """The configuration's baseline (`load.baselines`: the one rule of the verdicts and the progression)."""
    from .load import baselines

    return baselines(sd, every=True).get(cid)


def quality_section(sd: StudyData) -> tuple[str, Any | None]:
    """The quality check of every configuration with a quality.json and a baseline that has one."""
    w, labels = sd.w, sd.labels()
    rows, notes = [], []
    for c in sd.study.configurations:
        q, base = quality_of(sd, c.id), _baseline(sd, c.id)
        bq = quality_of(sd, base) if base else None
        if q is None or bq is None:
            continue
        cmp = compare_quality(q, bq)
        idx = [d["token_index"] for d in cmp["first_divergence"]]
        rows.append([labels.get(c.id, c.id), labels.get(base, base), f"{cmp['identical']}/{cmp['total']}",
                     cmp["identical_share"] * 100, statistics.median(idx) if idx else None, min(idx) if idx else None,
                     f"{cmp['score'][0]}/{cmp['score'][1]}", f"{cmp['baseline_score'][0]}/{cmp['baseline_score'][1]}"])
        notes += [w("checks.quality_diverged", label=labels.get(c.id, c.id),
                    items=", ".join(f"{d['set']}/{d['id']} @{d['token_index']}" for d in cmp["first_divergence"]))
                  ] if idx else []
    if not rows:
        return "", None
    cols = w("checks.quality_columns")
    t = pd.DataFrame(rows, columns=cols)
    sep = "" if sd.language == "ja" else " "  # Japanese sentences run on without a space
    text = w("checks.quality_text") + (sep + w("checks.quality_text_device") if sd.meta.get("sessions") else "")
    return text, html.table(t, w("checks.t_quality"), formats={cols[3]: "{:.0f}", cols[4]: "{:.0f}",
                                                                               cols[5]: "{:.0f}"},
                                              notes=[w("checks.quality_none")] + notes if t[cols[4]].isna().any()
                                              else notes)


def speculative_rows(sd: StudyData) -> pd.DataFrame:
    """Per speculating configuration, prompt set and concurrency: tok/s without and with drafts
    (the baseline's run of the same set), acceptance and mean accepted length (incl. the bonus token)."""
    rows = []
    for c in sd.study.configurations:
        runs, base = speculative_of(sd, c.id), _baseline(sd, c.id)
        ref = {(r["set"], r["concurrency"]): r for r in speculative_of(sd, base)} if base else {}
        for r in runs:
            k = r["counters"]
            if not k.get(DRAFTS):
                continue
            b = ref.get((r["set"], r["concurrency"]))
            per_pos = [k[p] / k[DRAFTS] for p in sorted((x for x in k if x.startswith("pos")), key=lambda x: int(x[3:]))]
            rows.append({"config": c.id, "set": r["set"], "kind": r["kind"], "concurrency": r["concurrency"],
                         "requests": r["requests"], "output_tokens": r["output_tokens"],
                         "tps_without": b["output_tps"] if b else None, "tps_with": r["output_tps"],
                         "speedup": r["output_tps"] / b["output_tps"] if b and b["output_tps"] else None,
                         "acceptance": k.get(ACCEPTED, 0.0) / k[DRAFT_TOKENS] if k.get(DRAFT_TOKENS) else None,
                         "mean_accepted_len": 1 + k.get(ACCEPTED, 0.0) / k[DRAFTS],
                         "per_position": per_pos})
    return pd.DataFrame(rows)


def speculative_section(sd: StudyData) -> tuple[str, Any | None]:
    df = speculative_rows(sd)
    if df.empty:
        return "", None
    w = sd.w
    cols = w("checks.spec_columns")
    t = pd.DataFrame([[f"{r.set} ({w('checks.kind_' + str(r.kind))})", int(r.concurrency), int(r.requests),
                       r.tps_without, r.tps_with, r.speedup, r.acceptance * 100 if r.acceptance is not None else None,
                       r.mean_accepted_len, " / ".join(f"{x * 100:.0f}" for x in r.per_position)]
                      for r in df.itertuples()], columns=cols)
    return w("checks.spec_text"), html.table(t, w("checks.t_spec"),
                                           formats={cols[3]: "{:,.0f}", cols[4]: "{:,.0f}", cols[5]: "{:.2f}",
                                                    cols[6]: "{:.1f}", cols[7]: "{:.2f}"})


def capacity_runs(sd: StudyData) -> list[tuple[str, dict[str, Any]]]:
    """(configuration, run.json) of each `{id}-capacity` folder, its search judged by today's rule
    from its records (`analysis.capacity.capacity_result`) under run.json's `capacity.result`."""
    out = []
    for c in sd.study.configurations:
        name = f"{c.id}-capacity"
        run = sd.file(RUN_JSON, name)
        if run is not None:
            f = sd.folder(name)
            if (run.get("capacity") or {}).get("result") and f.exists(RECORDS):
                run = {**run, "capacity": {**run["capacity"], "result": capacity_result(run, f.records)}}
            out.append((c.id, run))
    return out


def capacity_section(sd: StudyData) -> tuple[str, Any | None]:
    """The capacity-at-SLO search of each configuration that had one: the highest load meeting the
    SLO; under the table each bracket end's verdict with its confidence, and on a closed loop the
    capacity read off all its trials."""
    w, labels = sd.w, sd.labels()
    rows, fits = [], []
    runs = capacity_runs(sd)
    for cid, run in runs:
        cap = run.get("capacity") or {}
        res = cap.get("result") or {}
        if not res:
            continue
        lo, hi = (res.get("bracket") or [None, None])[:2]
        trials = str(int(res.get("trials") or 0))
        rows.append([labels.get(cid, cid), res.get("capacity"), hi, res.get("output_tps"), res.get("in_flight"),
                     w(f"capacity.term.{res['binding']}") if res.get("binding") else "–",
                     trials if run.get("status") == "complete" else w("checks.capacity_status", n=trials,
                                                                      status=run.get("status"))])
        fits.append(w("checks.capacity_ends", label=labels.get(cid, cid), ends=ends_cell(sd, res)) + fit_sentence(sd, res))
    if not rows:
        return "", None
    cols = w("checks.capacity_columns")
    spec = runs[0][1]["capacity"]
    shape = spec.get("shape") or {}
    text = w("checks.capacity_text", axis=spec["spec"]["axis"], terms=", ".join(
        f"{w('capacity.term.' + k)} ≤ {v:g}" + (" s" if k != "error_rate" else "")
        for k, v in (spec.get("targets") or {}).items() if isinstance(v, (int, float))),
        duration=shape.get("duration_s")) + "".join("\n\n" + f for f in fits)
    t = pd.DataFrame(rows, columns=cols)
    return text, html.table(t, w("checks.t_capacity"), formats={cols[1]: "{:g}", cols[2]: "{:g}", cols[3]: "{:,.0f}",
                                                             cols[4]: "{:.1f}"},
                          notes={html.MISSING: w("checks.capacity_missing")} if t.isna().to_numpy().any() else None)


def startup_table(sd: StudyData) -> Any | None:
    """Seconds from a server's start to its health, per configuration: the study runner's (design.json's
    placement, each server with the configurations it served) or the recorded GPU sessions'."""
    w, labels = sd.w, sd.labels()
    rows = []
    placed = sd.design.placement or {}
    for sid, s in (placed.get("startup_s") or {}).items():
        server = (placed.get("servers") or {}).get(sid) or {}
        together = next((g for phase in placed.get("phases") or [] for lane in phase for g in lane["groups"]
                         if sid in g), [sid])
        rows.append([", ".join(labels.get(c, c) for c in server.get("configs") or [sid]), sd.design.started_at
                     or html.MISSING, s, w("checks.group_of", k=len(together)) if len(together) > 1 else html.MISSING])
    for d in sd.meta.get("sessions") or []:
        groups = d.get("startup_group") or {}  # configuration -> number of the group it started with
        for cid, s in (d.get("startup_s") or {}).items():
            g = groups.get(cid)
            together = w("checks.group", n=g, k=sum(1 for x in groups.values() if x == g)) if g else html.MISSING
            rows.append([labels.get(cid, cid), d.get("date"), s, together])
    if not rows:
        return None
    cols = w("checks.startup_columns")
    alone = {html.MISSING: w("checks.startup_alone")} if any(r[3] == html.MISSING for r in rows) else {}
    return html.table(pd.DataFrame(rows, columns=cols), w("checks.t_startup"), formats={cols[2]: "{:.0f}"},
                    notes={cols[2]: w("checks.startup_note"), **alone})


def sections(sd: StudyData) -> list[Any]:
    """The write-up's part for these measurements: heading, text and table of each that has data
    (nothing for a study without `checks:`, `capacity_runs:` or recorded start-up times)."""
    out: list[Any] = []
    quality = "checks.quality" if sd.meta.get("sessions") else "checks.quality_generic"  # a GPU study's: the fp8 check
    for key, (text, table) in (("checks.capacity", capacity_section(sd)), (quality, quality_section(sd)),
                               ("checks.speculative", speculative_section(sd))):
        if table is not None:
            out += [Markdown(f"{anchor(key.replace('.', '-'), sd.w(key))}\n\n{text}"), table]
    st = startup_table(sd)
    if st is not None:
        out.append(st)
    return out
