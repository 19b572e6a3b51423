"""The write-up's cost and peer sections: self-host against managed APIs at each
configuration's best measured level (prices from the committed, dated tables; the
published figures beside every ratio), and the engine's own benchmark tool run on the same
server, side by side with servelab's numbers."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from ..analysis.cost import cost_table, replay_cost_table, study_price
from ..analysis.peers import json_objects, vllm_bench_frame
from ..analysis.sglang_bench import sglang_bench_frame
from .. import hosts
from ..prices import load_table, resolve_managed
from ..summary import summarize
from . import html
from .load import StudyData, engine_gpus
from .verdicts import physics_note


def _best_levels(sd: StudyData) -> pd.DataFrame:
    s = sd.summary
    return s.loc[s.groupby("config", sort=False)["aggregate_output_tps"].idxmax()]


def hourly_share(sd: StudyData, cid: str, price: Any) -> tuple[float, str | None]:
    """The hourly price charged to one configuration: its share of the instance's GPUs
    (the engine's TP x PP x DP, at least cost.gpus_used) when the study prices per GPU."""
    cost = sd.study.cost
    gpus = next((e.get("gpus") for e in load_table().get("ec2_on_demand", [])
                 if e["instance_type"] == price.instance_type), None) if cost and cost.gpus_used else None
    if not gpus:
        return price.usd_per_hour, None
    used = max(cost.gpus_used, engine_gpus(sd, cid))
    return price.usd_per_hour * used / gpus, f"{used}/{gpus} GPUs"


def _gpu_model(name: str | None) -> str | None:
    """The GPU's model in a name ("NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA L40S" -> "L40S"); None without one."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name or "")
    return m.group(1) if m else None


def other_gpu(sd: StudyData, price: Any) -> str:
    """A sentence where the priced instance's GPUs are not the ones the speeds were measured on ("" where they are,
    or where either is not known): the cost is then what these speeds would cost at that price."""
    gpu = next((e.get("gpu") for e in load_table().get("ec2_on_demand", []) if e["instance_type"] == price.instance_type),
               None)
    measured = next((g.get("name") for c in sd.config_ids for g in sd.runs[c].get("gpus_used") or [] if g.get("name")),
                    None)
    a, b = _gpu_model(gpu), _gpu_model(measured)
    if not a or not b or a == b:
        return ""
    return " " + sd.w("cost.other_gpu", instance=price.instance_type, gpu=gpu, measured=measured)


def cost_rows(sd: StudyData) -> tuple[pd.DataFrame, str]:
    """(cost_table rows at each configuration's best level, what the prices are)."""
    cost = sd.study.cost
    if cost is None:  # nothing priced (a local machine): the section says so, with no one else's rows
        return pd.DataFrame(), "none"
    if cost.replay_price and hosts.get(sd.study.host.kind).cost_basis == "endpoint":
        m = resolve_managed([cost.replay_price])[cost.replay_price]
        return replay_cost_table(sd.summary, m, cost.cached_input_fraction), "replay"
    price = study_price(sd.study, use_api=False)
    managed = resolve_managed(cost.managed)
    rows = []
    for cid, b in _best_levels(sd).groupby("config", sort=False):
        hourly, share = hourly_share(sd, cid, price)
        t = cost_table(b, hourly, managed, hours=cost.hours_per_month, utilization=cost.utilization,
                       fixed_monthly_usd=sum(cost.fixed_monthly_usd.values()), always_on=cost.always_on,
                       cached_input_fraction=cost.cached_input_fraction)
        rows.append(t.assign(gpu_share=share or ""))
    return pd.concat(rows, ignore_index=True), "instance"


def cost_sentence(sd: StudyData) -> tuple[str, str]:
    """The headline's cost sentence: the best configuration's $ per 1M output tokens against the
    managed API, with the published ratio beside it where the study reproduces a published one; ""
    when nothing is priced (a local machine: the cost section says so). And the physics flag of the
    level it prices (`report.verdicts.physics_note`), "" when none."""
    t, kind = cost_rows(sd)
    if kind != "instance" or t.empty:
        return "", ""
    r = t.loc[t["aggregate_output_tps"].idxmax()]
    flag = physics_note(sd, str(r["config"]), str(r["bucket"]), float(r["concurrency"])) if "concurrency" in t else ""
    price = study_price(sd.study, use_api=False)
    if "managed_usd_per_m_output" not in t:  # priced, with no managed API named to hold it against
        return sd.w("headline.cost_unmanaged", label=sd.labels().get(r["config"], r["config"]),
                    usd=f"{r['usd_per_m_output']:,.2f}",
                    instance=f"{price.instance_type} ({r['gpu_share'] or sd.w('cost.whole_instance')})"), flag
    ratio = r["usd_per_m_output"] / r["managed_usd_per_m_output"] if r["managed_usd_per_m_output"] else math.nan
    return sd.w("headline.cost", label=sd.labels().get(r["config"], r["config"]), usd=f"{r['usd_per_m_output']:,.2f}",
                instance=f"{price.instance_type} ({r['gpu_share'] or sd.w('cost.whole_instance')})", managed=r["managed"],
                m_usd=f"{r['managed_usd_per_m_output']:,.2f}", ratio=f"{ratio:,.1f}×"), flag


def cost_section(sd: StudyData) -> tuple[str, Any]:
    """(text, table): self-host vs managed at each configuration's best measured level."""
    t, kind = cost_rows(sd)
    c = sd.w("cost.columns")
    if kind == "none":
        return sd.w("cost.left_out"), None
    if kind == "replay":
        m = resolve_managed([sd.study.cost.replay_price])[sd.study.cost.replay_price]
        text = sd.w("cost.replay", price=m.label())
        view = t[["config", "bucket", "concurrency", "usd_per_m_output"]].copy()
        view.columns = [c[0], "bucket", "c", c[3]]
        return text, html.table(view, sd.w("cost.caption"), formats={c[3]: "{:,.4f}"})
    rows = []
    for r in t.itertuples():
        rows.append([r.config, f"{r.bucket} c={r.concurrency}", r.aggregate_output_tps, r.usd_per_m_output,
                     r.managed, getattr(r, "managed_usd_per_m_output", math.nan),
                     f"{r.selfhost_to_managed:,.2f}×" if math.isfinite(getattr(r, "selfhost_to_managed", math.nan))
                     else html.MISSING, f"{r.break_even_utilization * 100:,.0f} %"
                     if math.isfinite(getattr(r, "break_even_utilization", math.nan)) else html.MISSING])
    view = pd.DataFrame(rows, columns=c)
    fm = {c[2]: "{:,.1f}", c[3]: "{:,.2f}", c[5]: "{:,.2f}"}
    price = study_price(sd.study, use_api=False)
    managed = resolve_managed(sd.study.cost.managed)
    shares = sorted({s for s in t.get("gpu_share", []) if s})
    text = sd.w("cost.instance", instance=price.instance_type, region=price.region,
                price=html.quote_md(price.label(), sd.language),
                share=sd.w("cost.gpu_share", shares=", ".join(shares)) if shares else "",
                managed="; ".join(html.quote_md(m.label(), sd.language) for m in managed.values()),
                hours=sd.study.cost.hours_per_month) + other_gpu(sd, price)
    return text, html.table(view, sd.w("cost.caption"), formats=fm)


# -- peer tools ---------------------------------------------------------------------------------

def peer_files(sd: StudyData) -> list[Any]:
    root = sd.data_dir / "peer"
    return sorted(root.glob("*/*.json")) + sorted(root.glob("*/*.jsonl")) if root.is_dir() else []


def _import_peer(f: Any, cid: str) -> tuple[str, pd.DataFrame]:
    objs = json_objects(f.read_text(encoding="utf-8"))
    if f.suffix == ".jsonl":
        return "sglang bench_serving", sglang_bench_frame(objs, config=cid)
    return "vllm bench serve", vllm_bench_frame(objs, config=cid)


def peer_section(sd: StudyData) -> tuple[str, Any]:
    """The peer tool's results beside servelab's for the same configuration, concurrency and
    (nearest) prompt length."""
    files = peer_files(sd)
    if not files:
        return sd.w("peer.none"), None
    rows = []
    for f in files:
        cid = f.parent.name
        tool, frame = _import_peer(f, cid)
        peer = summarize(frame)
        mine = sd.summary[sd.summary["config"] == cid]
        for p in peer.itertuples():
            cand = mine[mine["concurrency"] == p.concurrency]
            if cand.empty:
                continue
            m = cand.loc[(cand["prompt_tokens"] - p.prompt_tokens).abs().idxmin()]
            for name, r in (("servelab", m), (tool, pd.Series(p._asdict()))):
                rows.append([cid, int(p.concurrency), name, int(r["ok"]), r["prompt_tokens"], r["ttft_p50_s"] * 1000,
                             r["tpot_p50_s"] * 1000, r["aggregate_output_tps"]])
    cols = sd.w("peer.columns")
    text = sd.w("peer.intro")
    t = pd.DataFrame(rows, columns=cols)
    return text, html.table(t, sd.w("peer.caption"), formats={cols[4]: "{:,.0f}", cols[5]: "{:,.1f}", cols[6]: "{:,.2f}",
                                                      cols[7]: "{:,.1f}"})
