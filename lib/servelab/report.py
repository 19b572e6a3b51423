"""Report building blocks: load a published study's data, make the seed-style tables and the
prose that carries numbers, convert the executed write-up to HTML, list all studies, and
check a rendered page in headless Chromium. Everything here is a pure function of files under
`reports/<study>/data/`; no server is contacted. Not for measuring or plotting (`plots`).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .records import RECORDS, RUN_JSON, SERVER_METRICS, read_json
from .records import load_records as _load_records
from .summary import DEFINITIONS, summarize

TEXT: dict[str, dict[str, str]] = {
    "en": {
        "configs": "Configurations",
        "changes": "What changes between configurations",
        "method": "How it was measured",
        "results": "Results",
        "progression": "Stage-by-stage progression",
        "figures": "Figures",
        "repro": "Reproducibility record",
        "definitions": "Metric definitions",
        "no_change": "identical engine settings",
        "baseline": "baseline",
        "method_body": (
            "Every request streams from `{api}` with `stream_options.include_usage`, `ignore_eos`, "
            "`temperature={temperature}`, `seed={seed}` and `max_tokens` equal to the bucket's output length; "
            "token counts come from the server's `usage`. Prompts are the sentence *\"{prompt_text}\"* repeated "
            "and calibrated through {counter} to the target token count after the chat template "
            "(achieved: {calibration}). Each load level (bucket x concurrency c) runs {warmup} warmup "
            "round(s), excluded, then {rounds} measured round(s) of {k} x c requests sent by c concurrent "
            "workers. {salt} Times are taken on the client with `time.perf_counter_ns`."
        ),
        "salt_on": "Each request carries a unique `cache_salt`, so the prefix cache is never reused across requests.",
        "salt_off": "No `cache_salt` is sent: repeated prompts may hit the prefix cache.",
        "headline": "Headline",
    },
    "ja": {
        "configs": "構成",
        "changes": "構成間で変えたもの",
        "method": "測定方法",
        "results": "測定結果",
        "progression": "段階別の性能推移",
        "figures": "図",
        "repro": "再現性の記録",
        "definitions": "指標の定義",
        "no_change": "エンジン設定は同一",
        "baseline": "基準",
        "method_body": (
            "すべてのリクエストは `{api}` へストリーミングで送信し、`stream_options.include_usage`、`ignore_eos`、"
            "`temperature={temperature}`、`seed={seed}`、バケットの出力長と同じ `max_tokens` を指定しました。"
            "トークン数はサーバーの `usage` から取得しています。入力は定型文 *\"{prompt_text}\"* の繰り返しで、"
            "{counter} を使って Chat Template 適用後のトークン数が目標値になるよう調整しました（実測: {calibration}）。"
            "各負荷レベル（バケット × 並列数 c）で warm-up を {warmup} round 実行して集計から除外し、"
            "その後 {rounds} round（1 round は c 並列で {k} × c リクエスト）を本計測としました。{salt}"
            "時刻はクライアント側の `time.perf_counter_ns` で計測しています。"
        ),
        "salt_on": "各リクエストに異なる `cache_salt` を設定し、リクエスト間で Prefix Cache を再利用しない条件に揃えました。",
        "salt_off": "`cache_salt` は送っていないため、同じ入力は Prefix Cache にヒットし得ます。",
        "headline": "結論",
    },
}


@dataclass
class StudyData:
    """A published study: params, and per configuration its records, summary, run.json, metrics."""

    root: Path
    study: dict[str, Any]
    records: pd.DataFrame
    summary: pd.DataFrame
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics_paths: dict[str, Path] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # study.json beside the study (e.g. device session)

    @property
    def language(self) -> str:
        return self.study.get("language", "en")

    def t(self, key: str) -> str:
        return TEXT[self.language].get(key) or TEXT["en"][key]

    @property
    def config_ids(self) -> list[str]:
        return [c["id"] for c in self.study["configurations"] if c["id"] in self.runs]

    def labels(self) -> dict[str, str]:
        return {c["id"]: c.get("label") or c["id"] for c in self.study["configurations"]}


def load_study_data(study_dir: str | Path) -> StudyData:
    """Read `<study_dir>/data/` (a published report) or a runs/<study> folder."""
    root = Path(study_dir)
    data = root / "data" if (root / "data").is_dir() else root
    sj = read_json(data / "study.json")
    study = sj["study"]
    runs, mpaths, dirs = {}, {}, []
    for c in study["configurations"]:
        d = data / c["id"]
        if (d / RECORDS).exists():
            dirs.append(d)
            runs[c["id"]] = read_json(d / RUN_JSON) if (d / RUN_JSON).exists() else {}
            if (d / SERVER_METRICS).exists():
                mpaths[c["id"]] = d / SERVER_METRICS
    recs = _load_records(dirs)
    meta = {k: v for k, v in sj.items() if k != "study"}
    return StudyData(root=root, study=study, records=recs, summary=summarize(recs), runs=runs, metrics_paths=mpaths,
                     meta=meta)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def engine_gpus(sd: StudyData, config_id: str) -> int:
    """GPUs the configuration's engine spanned (TP x PP x DP of the args it ran with)."""
    from .profiles import gpu_count

    return gpu_count((sd.runs[config_id].get("engine_params") or {}).get("args") or {})


def engine_settings(sd: StudyData, config_id: str) -> dict[str, Any]:
    """The configuration's resolved engine params (from run.json), flattened."""
    run = sd.runs.get(config_id, {})
    return _flat(run.get("engine_params") or {})


def config_table(sd: StudyData) -> pd.DataFrame:
    """One row per configuration: id, label, engine version, and what differs from its baseline."""
    from .diagnose import config_diff

    rows, bases = [], baselines(sd)
    for cid in sd.config_ids:
        cur = sd.runs[cid].get("engine_params") or {}
        base = bases.get(cid)
        if base is None:
            change = sd.t("baseline")
        else:
            diffs = [f"{k}: {a} → {b}" for k, a, b in config_diff(sd.runs[base].get("engine_params") or {}, cur)]
            change = "; ".join(diffs) if diffs else sd.t("no_change")
        run = sd.runs[cid]
        rows.append({"configuration": cid, "label": sd.labels().get(cid, cid),
                     "engine": f"{run.get('engine_params', {}).get('kind', '?')} {run.get('server', {}).get('version') or ''}".strip(),
                     "compared with": base or "", "change": change, "status": run.get("status")})
    for c in sd.study["configurations"]:  # planned but not measured: say so, don't drop silently
        if c["id"] not in sd.runs:
            rows.append({"configuration": c["id"], "label": c.get("label") or c["id"], "engine": "",
                         "compared with": "", "change": "", "status": "not measured (no run data)"})
    return pd.DataFrame(rows).set_index("configuration") if rows else pd.DataFrame()


def common_settings(sd: StudyData) -> pd.DataFrame:
    """Engine settings shared by every configuration (the fixed part of the experiment)."""
    settings = [engine_settings(sd, c) for c in sd.config_ids]
    if not settings:
        return pd.DataFrame()
    keys = [k for k in settings[0] if all(s.get(k) == settings[0][k] for s in settings)]
    return pd.DataFrame({"setting": keys, "value": [str(settings[0][k]) for k in keys]}).set_index("setting")


def seed_table(sd: StudyData, config_id: str) -> pd.DataFrame:
    """Seed 001's table: rows = prompt length, columns = concurrency x (TTFT, per-request, aggregate)."""
    s = sd.summary[sd.summary["config"] == config_id].copy()
    if s.empty:
        return pd.DataFrame()
    s["TTFT p50 (ms)"] = s["ttft_p50_s"] * 1000
    s["E2E tok/s"] = s["e2e_output_tps_p50"]
    s["decode tok/s"] = s["decode_tps_p50"]
    s["aggregate tok/s"] = s["aggregate_output_tps"]
    s["input tokens"] = s["prompt_tokens"].round().astype("Int64")
    t = s.pivot_table(index="input tokens", columns="concurrency",
                      values=["TTFT p50 (ms)", "E2E tok/s", "decode tok/s", "aggregate tok/s"], aggfunc="first")
    t = t.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0)
    order = ["TTFT p50 (ms)", "E2E tok/s", "decode tok/s", "aggregate tok/s"]
    t = t.reindex(columns=[(c, m) for c in sorted(s["concurrency"].unique()) for m in order])
    t.columns.names = ["concurrency", ""]
    return t.round(1)


def progression(sd: StudyData, metric: str = "aggregate_output_tps") -> pd.DataFrame:
    """Stage-by-stage progression: each configuration's value per level and % change vs its baseline."""
    s = sd.summary
    if s.empty:
        return pd.DataFrame()
    piv = s.pivot_table(index=["bucket", "concurrency"], columns="config", values=metric, aggfunc="first", sort=False)
    cols = [c for c in sd.config_ids if c in piv.columns]
    out = pd.DataFrame(index=piv.index)
    for c in cols:
        out[c] = piv[c]
    for c, base in baselines(sd, piv).items():
        out[f"Δ% {c} vs {base}"] = (piv[c] / piv[base] - 1) * 100
    return out.round(1)


def baselines(sd: StudyData, piv: pd.DataFrame | None = None) -> dict[str, str]:
    """Each configuration's baseline: the one its params name (`baseline:`), else the nearest earlier
    configuration measured on at least one of the same levels (a configuration with its own workload
    skips those it shares none with)."""
    if piv is None:
        piv = sd.summary.pivot_table(index=["bucket", "concurrency"], columns="config", values="aggregate_output_tps",
                                     aggfunc="first", sort=False)
    cols = [c for c in sd.config_ids if c in piv.columns]
    named = {c["id"]: c["baseline"] for c in sd.study["configurations"] if c.get("baseline")}
    out = {}
    for i, c in enumerate(cols):
        if named.get(c) in cols[:i]:
            out[c] = named[c]
            continue
        for prev in reversed(cols[:i]):
            if (piv[c].notna() & piv[prev].notna()).any():
                out[c] = prev
                break
    return out


def definitions_table() -> pd.DataFrame:
    return pd.DataFrame({"metric": list(DEFINITIONS), "definition": list(DEFINITIONS.values())}).set_index("metric")


def method_text(sd: StudyData) -> str:
    wl = sd.study["workload"]
    first = next(iter(sd.runs.values()), {})
    cal = first.get("calibration", {})
    counter = next(iter(cal.values()), {}).get("counter", "the server's /tokenize")
    achieved = ", ".join(f"{v['target_tokens']}→{v['tokens']}" for v in cal.values()) or "n/a"
    api = "/v1/chat/completions" if wl.get("api", "chat") == "chat" else "/v1/completions"
    return sd.t("method_body").format(
        api=api, temperature=wl.get("temperature"), seed=wl.get("seed"), prompt_text=wl.get("prompt_text"),
        counter=counter, calibration=achieved, warmup=wl.get("warmup_rounds"), rounds=wl.get("rounds"),
        k=wl.get("requests_per_round", 1), salt=sd.t("salt_on") if wl.get("cache_salt", True) else sd.t("salt_off"))


def headline(sd: StudyData) -> str:
    """Computed conclusions: best aggregate throughput per configuration and the biggest change."""
    s = sd.summary
    if s.empty:
        return "No measured requests."
    ja = sd.language == "ja"
    lines = []
    for cid in sd.config_ids:
        d = s[s["config"] == cid]
        if d.empty:
            continue
        best = d.loc[d["aggregate_output_tps"].idxmax()]
        c1 = d[d["concurrency"] == d["concurrency"].min()].sort_values("prompt_tokens")
        ttfts = ", ".join(f"{int(r.prompt_tokens)}: {r.ttft_p50_s * 1000:.0f} ms" for r in c1.itertuples())
        if ja:
            lines.append(f"- **{cid}**: 合計スループット最大 {best.aggregate_output_tps:.1f} tok/s"
                         f"（{best.bucket}、並列数 {int(best.concurrency)}）。並列数 {int(c1.concurrency.min())} の TTFT 中央値: {ttfts}。"
                         f" 成功率 {d['ok'].sum() / d['sent'].sum() * 100:.1f}%。")
        else:
            lines.append(f"- **{cid}**: peak aggregate {best.aggregate_output_tps:.1f} output tok/s "
                         f"({best.bucket}, concurrency {int(best.concurrency)}); TTFT p50 at concurrency "
                         f"{int(c1.concurrency.min())} by prompt tokens: {ttfts}; success rate "
                         f"{d['ok'].sum() / d['sent'].sum() * 100:.1f}%.")
    missing = [c["id"] for c in sd.study["configurations"] if c["id"] not in sd.runs]
    if missing:
        lines.append(f"- Not measured: {', '.join(missing)} (planned in the params file; no run data)."
                     + (f" {sd.meta['not_measured_note']}" if sd.meta.get("not_measured_note") else ""))
    for d in sd.meta.get("device") or []:  # one entry per device session
        what = f": {d['configurations']}" if d.get("configurations") else ""
        lines.append(f"- Measured on the device machine `{d.get('kind')}` ({d.get('machine')}) on {d.get('date')}, "
                     f"{d.get('held_s', 0) / 60:.1f} min of device time{what}.")
    ids = sd.config_ids
    if len(ids) >= 2:
        p = progression(sd)
        for b, a in baselines(sd).items():
            col = f"Δ% {b} vs {a}"
            if col in p and p[col].notna().any():
                worst = p[col].idxmin()
                val = p.loc[worst, col]
                lvl = f"{worst[0]}, c={worst[1]}"
                lines.append(f"- {b} vs {a}: aggregate tok/s changes by {p[col].min():+.1f}% to {p[col].max():+.1f}% "
                             f"across levels (lowest, {val:+.1f}%, at {lvl})." if not ja else
                             f"- {b} と {a} の比較: 合計スループットの変化は {p[col].min():+.1f}% 〜 {p[col].max():+.1f}%"
                             f"（最小は {lvl} の {val:+.1f}%）。")
    return "\n".join(lines)


def repro_table(sd: StudyData) -> pd.DataFrame:
    """The reproducibility record of each configuration, one row per field (seed 002's list)."""
    rows = []
    for cid in sd.config_ids:
        r = sd.runs[cid]
        srv = r.get("server", {})
        host = r.get("client_host", {})
        facts = (r.get("model") or {}).get("facts", {})
        eng = r.get("engine_params", {})
        hd = r.get("headline", {})
        fields = {
            "model": f"{facts.get('architecture', '?')} ({facts.get('param_count', 0) / 1e6:.1f} M params, "
                     f"{facts.get('dtype', '?')}), weights: {eng.get('load_format') or 'checkpoint'}",
            "model revision": (r.get("model") or {}).get("path", r.get("model_name")),
            "engine": f"{eng.get('kind')} {srv.get('version')}",
            "launch command": " ".join(srv.get("command") or []) or srv.get("base_url", ""),
            "engine env": " ".join(f"{k}={v}" for k, v in (srv.get("env") or {}).items()),
            "hardware": ", ".join(g["name"] for g in host.get("gpus", [])) or f"CPU: {host.get('cpu_model')} x{host.get('cpu_count')}",
            "precision / KV dtype": f"{eng.get('args', {}).get('dtype', 'auto')} / {eng.get('args', {}).get('kv-cache-dtype', 'auto')}",
            "parallel layout": f"TP={eng.get('args', {}).get('tensor-parallel-size', 1)}",
            "startup time": f"{srv.get('startup_s', float('nan')):.1f} s" if srv.get("startup_s") else "n/a",
            "peak engine RSS": f"{srv.get('peak_rss_bytes', 0) / 2**30:.2f} GiB" if srv.get("peak_rss_bytes") else "n/a",
            "functional check": _smoke_text(srv.get("smoke_check")),
            "run window": f"{r.get('started_at')} → {r.get('finished_at')}",
            "status": f"{r.get('status')} ({r.get('records')} records) {r.get('message') or ''}".strip(),
            "success rate": f"{hd.get('success_rate', float('nan')) * 100:.1f}%" if hd.get("success_rate") is not None else "n/a",
            "client host": f"{host.get('cpu_model')} x{host.get('cpu_count')}, Python {host.get('python')}",
            "servelab": f"{r.get('servelab', {}).get('version')} @ {str(r.get('servelab', {}).get('commit'))[:12]}"
                        f"{' (dirty)' if r.get('servelab', {}).get('dirty') else ''}",
            "packages": ", ".join(f"{k} {v}" for k, v in (r.get("packages") or {}).items()),
        }
        for k, v in fields.items():
            rows.append({"configuration": cid, "field": k, "value": v})
    t = pd.DataFrame(rows)
    return t.pivot(index="field", columns="configuration", values="value").reindex(
        index=list(dict.fromkeys(t["field"])), columns=sd.config_ids) if not t.empty else t


def _smoke_text(sm: dict[str, Any] | None) -> str:
    if not sm:
        return "not recorded"
    chat = (sm.get("chat") or {})
    reply = (chat.get("text") or "")[:60].replace("\n", " ")
    tool = sm.get("tool_call")
    tool_txt = f"; tool call: {json.dumps((tool or {}).get('function'))[:80]}" if tool else ""
    if sm.get("applies") is False:
        return f"does not apply ({sm.get('reason')}); server answered: {sm.get('answered')}{tool_txt}"
    return f"{'passed' if sm.get('ok') else 'FAILED'}: reply {reply!r}{tool_txt} {sm.get('reason') or ''}".strip()


# -- cost -------------------------------------------------------------------------------------------

COST_COLUMNS = {
    "config": "config", "bucket": "bucket", "concurrency": "c", "aggregate_output_tps": "agg tok/s",
    "usd_per_m_output": "self-host $/1M out", "selfhost_monthly_usd": "self-host $/month",
    "managed": "managed API", "managed_usd_per_m_output": "managed $/1M out (incl. input)",
    "managed_monthly_usd": "managed $/month, same tokens", "selfhost_to_managed": "self-host / managed",
    "break_even_utilization": "break-even utilization", "selfhost_usd_per_request": "self-host $/request",
}


def _cost_view(t: pd.DataFrame) -> pd.DataFrame:
    return t[[c for c in COST_COLUMNS if c in t]].rename(columns=COST_COLUMNS).round(4)


def cost_section(sd: StudyData) -> tuple[str, pd.DataFrame]:
    """Self-host vs managed API at the measured aggregate throughput (computed, never typed in).
    Prices come from the committed, dated table (servelab/data/prices.yaml)."""
    from .config import Study
    from .cost import CostParams, cost_table, resolve_managed, seed001_published, seed001_summary
    from .prices import load_table

    study = Study.model_validate(sd.study)
    cost = study.cost
    if cost is None:
        pub = seed001_published()
        keys = ["fireworks/deepseek-v4-flash"]
        t = cost_table(seed001_summary(), pub["monthly_usd"] / pub["hours"], resolve_managed(keys))
        text = ("This study runs on a local machine with no instance price, so no cost applies to its numbers. "
                "For scale, the same computation on **seed 001's published figures** (g7e.12xlarge, "
                f"{pub['monthly_usd']:,.0f} USD per 730 h all-in, aggregate tok/s as published: 102.67 at "
                "concurrency 1, 297.09 at 4, MTP 135.55 / 358.4; Fireworks $0.22 in / $0.66 out per 1M, as quoted "
                "in seed 001):")
        return text, _cost_view(t)
    from .cost import replay_cost_table, study_price

    if cost.replay_price and study.host.kind == "attach":  # a managed endpoint replayed: what it charged
        m = resolve_managed([cost.replay_price])[cost.replay_price]
        t = replay_cost_table(sd.summary, m, cost.cached_input_fraction)
        return (f"The measured tokens priced at the managed endpoint's list price: {m.label()}. Latency of the "
                "same workload is in the tables above, so self-hosted and managed sit side by side."), t.round(4)
    price = study_price(study, use_api=False)
    gpus = next((e.get("gpus") for e in load_table().get("ec2_on_demand", [])
                 if e["instance_type"] == price.instance_type), None) if cost.gpus_used else None
    managed = resolve_managed(cost.managed)
    rows, shares = [], {}
    best = sd.summary.loc[sd.summary.groupby("config", sort=False)["aggregate_output_tps"].idxmax()]
    for cid, b in best.groupby("config", sort=False):
        hourly = price.usd_per_hour
        if gpus:  # a per-GPU share: the study's gpus_used, or more where the engine spans more GPUs (TP/PP/DP)
            used = max(cost.gpus_used, engine_gpus(sd, cid))
            hourly = hourly * used / gpus
            shares.setdefault(f"{used}/{gpus} GPUs = ${hourly:,.4f}/h", []).append(cid)
        rows.append(cost_table(b, hourly, managed, hours=cost.hours_per_month, utilization=cost.utilization,
                               fixed_monthly_usd=sum(cost.fixed_monthly_usd.values()), always_on=cost.always_on,
                               cached_input_fraction=cost.cached_input_fraction))
    share = ("" if not shares else " Each configuration is charged its share of the instance's GPUs (the engine's "
             "tensor x pipeline x data parallel size, at least cost.gpus_used): "
             + "; ".join(f"{k} ({', '.join(v)})" for k, v in shares.items()) + ".")
    lines = [f"Instance price: {price.instance_type} {price.region}: {price.label()}.{share}",
             "Managed APIs: " + "; ".join(m.label() for m in managed.values()) + ".",
             f"Each row takes the configuration's highest measured aggregate throughput (its best level) and holds "
             f"it for {cost.hours_per_month:g} h at utilization {cost.utilization:g}; input tokens follow that "
             "level's measured prompt/output ratio. The managed prices are for the models the seeds compared; "
             "they price the same token volume, not the same model."]
    return "\n\n".join(lines), _cost_view(pd.concat(rows))


# -- peer tools ---------------------------------------------------------------------------------------

def peer_section(sd: StudyData) -> tuple[str, pd.DataFrame]:
    """`vllm bench serve` results saved beside the runs (data/peer/<config>/*.json), each next to
    servelab's measurement of the same configuration at the same concurrency and prompt length."""
    from .importers import import_vllm_bench

    root = sd.root / "data" / "peer" if (sd.root / "data").is_dir() else sd.root / "peer"
    files = sorted(root.glob("*/*.json")) if root.is_dir() else []
    if not files:
        return "No peer tool was run for this study.", pd.DataFrame()
    rows = []
    for f in files:
        cid = f.parent.name
        peer = summarize(import_vllm_bench(f, config=cid))
        mine = sd.summary[sd.summary["config"] == cid]
        for p in peer.itertuples():
            cand = mine[mine["concurrency"] == p.concurrency]
            if cand.empty:
                continue
            m = cand.loc[(cand["prompt_tokens"] - p.prompt_tokens).abs().idxmin()]
            for tool, r in (("servelab", m), ("vllm bench serve", pd.Series(p._asdict()))):
                rows.append({"config": cid, "concurrency": int(p.concurrency), "tool": tool,
                             "requests": int(r["ok"]), "prompt tokens (p50)": r["prompt_tokens"],
                             "TTFT p50 ms": r["ttft_p50_s"] * 1000, "TTFT p95 ms": r["ttft_p95_s"] * 1000,
                             "TPOT p50 ms": r["tpot_p50_s"] * 1000, "output tok/s": r["aggregate_output_tps"]})
    t = pd.DataFrame(rows).round(1)
    text = ("Both tools measured the same server in the same session. Definitions differ in small ways "
            "(benchmarks/README.md): vLLM's TTFT ends at the first chunk with a non-empty `choices` list (for chat, "
            "the role-only chunk), servelab's at the first chunk carrying text; `vllm bench serve`'s random "
            "dataset sets the prompt length before the chat template, servelab after it; its output tok/s is total "
            "output over the whole benchmark, servelab's the median over rounds of each round's output over its "
            "wall time. servelab starts each round's c requests together and waits for all of them; vllm bench "
            "keeps c in flight, starting a request whenever one ends, so after its first wave its prefills "
            "seldom coincide: with long prompts at c > 1 its TTFT is lower by that queueing (for example 8K "
            "prompts at c=4), while TPOT and tok/s stay close.")
    return text, t.set_index(["config", "concurrency", "tool"]) if not t.empty else t


# -- HTML -------------------------------------------------------------------------------------

def notebook_to_html(nb_path: Path, out: Path, title: str = "servelab report") -> Path:
    """Executed notebook -> standalone HTML with inputs hidden and images embedded."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(nb_path), as_version=4)
    exp = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exp.from_notebook_node(nb, resources={"metadata": {"name": title}})
    out.parent.mkdir(parents=True, exist_ok=True)
    from .secrets import scrub

    out.write_text(scrub(body), encoding="utf-8")
    return out


def write_index(reports_root: Path) -> Path:
    """reports/index.html listing every published study."""
    rows = []
    for d in sorted(p for p in Path(reports_root).iterdir() if (p / "index.html").exists() and (p / "data").is_dir()):
        try:
            st = read_json(d / "data" / "study.json")["study"]
        except (OSError, KeyError, json.JSONDecodeError):
            continue
        runs = [read_json(c / RUN_JSON) for c in sorted((d / "data").iterdir()) if (c / RUN_JSON).exists()]
        when = max((r.get("finished_at") or "" for r in runs), default="")
        rows.append(f"<tr><td><a href='{html.escape(d.name)}/index.html'>{html.escape(d.name)}</a></td>"
                    f"<td>{html.escape(st.get('title', ''))}</td><td>{len(st.get('configurations', []))}</td>"
                    f"<td>{html.escape(when)}</td></tr>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>servelab reports</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
            "border-bottom:1px solid #ddd;text-align:left}</style></head><body><h1>servelab reports</h1>"
            "<table><tr><th>study</th><th>title</th><th>configurations</th><th>measured</th></tr>"
            + "".join(rows) + "</table></body></html>\n")
    out = Path(reports_root) / "index.html"
    out.write_text(page, encoding="utf-8")
    return out


def check_in_browser(html_path: Path, screenshot: Path | None = None, chromium: str = "/usr/bin/chromium") -> dict[str, Any]:
    """Open a report in headless Chromium; count images and broken ones, find error outputs.

    Returns {"images", "broken_images", "errors", "title"}; raises RuntimeError if Chromium
    cannot be started.
    """
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=args)
        try:
            page = b.new_page(viewport={"width": 1200, "height": 900})
            page.goto(Path(html_path).resolve().as_uri(), wait_until="load")
            res = page.evaluate("""() => {
                const imgs = Array.from(document.images);
                const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length;
                const errs = Array.from(document.querySelectorAll('.output_error, .jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'))
                    .map(e => e.innerText.slice(0, 200));
                const tb = document.body.innerText.includes('Traceback (most recent call last)');
                return {images: imgs.length, broken_images: broken, errors: errs, traceback: tb, title: document.title};
            }""")
            if screenshot:
                page.screenshot(path=str(screenshot), full_page=False)
        finally:
            b.close()
    return res


# -- diagnosis sections (issue: diagnosis) ---------------------------------------------------------

def _samples(sd: StudyData, cid: str) -> pd.DataFrame | None:
    from .metrics import load_samples

    p = sd.metrics_paths.get(cid)
    return load_samples(p) if p else None


def _facts(sd: StudyData, cid: str) -> dict[str, Any]:
    return ((sd.runs.get(cid) or {}).get("model") or {}).get("facts") or {}


def prefill_fit_table(sd: StudyData) -> pd.DataFrame:
    """TTFT = overhead + prompt_tokens / prefill_rate at concurrency 1, per configuration."""
    from .diagnose import fit_prefill

    fits = fit_prefill(sd.records[~sd.records["warmup"]] if not sd.records.empty else sd.records)
    rows = []
    for cid in sd.config_ids:
        f = fits.get(cid)
        if not f:
            continue
        def pm(v: float, se: float, scale: float = 1.0, nd: int = 0) -> str:
            if v != v:  # nan
                return "n/a"
            return f"{v * scale:.{nd}f}" + (f" ± {se * scale:.{nd}f}" if se == se else "")
        rows.append({"configuration": cid, "prefill tok/s (± SE)": pm(f["prefill_tps"], f["prefill_tps_se"]),
                     "fixed overhead ms (± SE)": pm(f["overhead_s"], f["overhead_s_se"], 1000, 1),
                     "r²": round(f["r2"], 3) if f["r2"] == f["r2"] else None, "requests": f["n"],
                     "note": f.get("note") or ""})
    return pd.DataFrame(rows).set_index("configuration") if rows else pd.DataFrame()


def saturation_table(sd: StudyData) -> pd.DataFrame:
    """Knee (where doubling concurrency stops paying) and goodput under the study's SLO."""
    from .diagnose import goodput, knee

    if sd.summary.empty:
        return pd.DataFrame()
    k = knee(sd.summary)
    g = goodput(sd.summary, sd.study.get("slo") or {})
    t = k.merge(g, on=["config", "bucket"], how="outer")
    cols = ["config", "bucket", "knee_concurrency", "reason", "goodput_concurrency", "aggregate_output_tps",
            "failing"]
    return t[[c for c in cols if c in t]].rename(columns={"aggregate_output_tps": "aggregate tok/s at goodput",
                                                          "reason": "knee rule"}).set_index(["config", "bucket"])


def slo_text(sd: StudyData) -> str:
    slo = sd.study.get("slo") or {}
    parts = []
    if slo.get("ttft_p95_s"):
        parts.append(f"p95 TTFT ≤ {slo['ttft_p95_s'] * 1000:.0f} ms")
    if slo.get("tpot_p95_s"):
        parts.append(f"p95 TPOT ≤ {slo['tpot_p95_s'] * 1000:.0f} ms")
    parts.append(f"error rate ≤ {slo.get('error_rate', 0.01) * 100:.1f}%")
    return "SLO: " + ", ".join(parts) + ". Goodput is the highest load level meeting all of them."


def kv_section(sd: StudyData, cid: str) -> tuple[str, pd.DataFrame, Any]:
    """Verdict sentence, per-level residency table and time-series figure of one configuration."""
    from .diagnose import kv_residency, kv_timeseries, kv_verdict

    s = _samples(sd, cid)
    if s is None or s.empty:
        return f"**{cid}**: the server exposed no `/metrics`; KV residency cannot be assessed.", pd.DataFrame(), None
    run = sd.runs[cid]
    v = kv_verdict(s, facts=_facts(sd, cid) or None, engine_args=run.get("engine_params"))
    verdict = ("**KV capacity limits concurrency.** " if v["limited"] else "**KV capacity does not limit concurrency.** ")
    res = kv_residency(s)
    cols = {"level": "level", "kv_usage_max_frac": "KV max %", "running_max": "running max", "waiting_max": "waiting max",
            "preemptions_delta": "preemptions", "crowded_samples": "samples waiting at KV ≥ 90%"}
    t = res[[c for c in cols if c in res]].rename(columns=cols)
    if "KV max %" in t:
        t["KV max %"] = (t["KV max %"] * 100).round(1)
    fig = kv_timeseries(s, title=f"KV cache and scheduler over time: {cid}")
    return f"**{cid}**: {verdict}{v['sentence']}", t.set_index("level"), fig


def roofline_table(sd: StudyData) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(hardware table, measured vs bound per level). The local CPU entry is the one measured
    during the run (run.json hardware_measured); a GPU entry is picked by the GPU's name."""
    from .hardware import HARDWARE, get_hardware, local_cpu_entry, roofline_efficiency

    def row(h: dict[str, Any], source: str | None = None) -> dict[str, Any]:
        return {"hardware": h["name"], "memory GB": (h.get("memory_bytes") or 0) / 1e9 or None,
                "bandwidth TB/s": h["memory_bandwidth_Bps"] / 1e12,
                "bf16 dense TFLOP/s": (h.get("bf16_dense_flops") or 0) / 1e12 or None,
                "fp8 dense TFLOP/s": (h.get("fp8_dense_flops") or 0) / 1e12 or None,
                "source": source or f"{h.get('source', '')} ({h.get('as_of', '')})"}

    hw_rows = [row(h) for h in HARDWARE]
    eff = []
    for cid in sd.config_ids:
        run = sd.runs[cid]
        facts = _facts(sd, cid)
        if not facts:
            continue
        gpus = (run.get("client_host") or {}).get("gpus") or []
        if run.get("hardware_measured"):
            hw = local_cpu_entry(run["hardware_measured"])
            hw_rows.append(row(hw, f"measured in this run ({cid}): numpy copy bandwidth, float32 matmul"))
        elif gpus:
            try:
                hw = get_hardware(gpus[0]["name"])
            except KeyError:
                continue
        else:
            continue
        e = roofline_efficiency(sd.summary[sd.summary["config"] == cid], facts, hw,
                                devices=engine_gpus(sd, cid) if gpus else 1)
        eff.append(e)
    hw_t = pd.DataFrame(hw_rows).drop_duplicates(subset=["hardware", "source"]).set_index("hardware").round(3)
    eff_t = pd.concat(eff) if eff else pd.DataFrame()
    return hw_t, eff_t


def spec_section(sd: StudyData) -> tuple[str, pd.DataFrame]:
    """Speculative decoding: acceptance from server counters, A/B against the configuration's
    baseline, and CUDA-graph capture-size warnings (seed 001's pitfall)."""
    from .diagnose import capture_size_warnings, spec_ab, spec_stats

    lines, tables, bases = [], [], baselines(sd)
    conc = sd.study["workload"].get("concurrency", [])
    for cid in sd.config_ids:
        args = (sd.runs[cid].get("engine_params") or {}).get("args") or {}
        for w in capture_size_warnings(args, conc):
            lines.append(f"- ⚠ **{cid}**: {w}")
        if "speculative-config" not in args and "speculative-algorithm" not in args:
            continue
        s = _samples(sd, cid)
        st = spec_stats(s) if s is not None else {}
        lines.append(f"- **{cid}**: acceptance rate {st.get('acceptance_rate', float('nan')):.1%}, mean acceptance "
                     f"length {st.get('mean_acceptance_length', float('nan')):.2f} ({st.get('source') or st.get('note')})")
        if cid in bases:
            base = bases[cid]
            ab = spec_ab(sd.summary[sd.summary["config"] == base], sd.summary[sd.summary["config"] == cid])
            tables.append(ab.assign(config=cid, baseline=base))
    if not lines:
        lines.append("No configuration of this study uses speculative decoding, and no CUDA-graph capture-size "
                     "problem was found.")
    return "\n".join(lines), pd.concat(tables) if tables else pd.DataFrame()


def one_change_table(sd: StudyData) -> pd.DataFrame:
    """Each configuration against its baseline: the variable that differs and the % changes."""
    from .diagnose import compare_configs

    if len(sd.config_ids) < 2:
        return pd.DataFrame()
    t = compare_configs([(c, sd.runs[c].get("engine_params") or {}) for c in sd.config_ids], sd.summary,
                        baselines=baselines(sd))
    keep = ["config", "baseline", "changed", "bucket", "concurrency", "ttft_p50_change_pct", "aggregate_change_pct",
            "decode_change_pct", "warning"]
    return t[[c for c in keep if c in t]].round(1)


def symptom_table(sd: StudyData, cid: str) -> pd.DataFrame:
    """Seed 002's observation -> first check table, filled from this configuration's data."""
    from .diagnose import symptoms

    return symptoms(sd.summary, _samples(sd, cid), slo=sd.study.get("slo"), config=cid).set_index("observation")


def client_overhead_text(sd: StudyData) -> str:
    """Levels where the client itself may have limited the result (run.json client_limited_levels)."""
    lines = []
    for cid in sd.config_ids:
        for lv in sd.runs[cid].get("client_limited_levels") or []:
            lines.append(f"- ⚠ **{cid}** {lv['label']} round {lv['round'] + 1}: {'; '.join(lv['reasons'])}")
    return ("The client limited these measurements, not the server:\n" + "\n".join(lines)) if lines else \
        "The client's event loop and CPU stayed within limits at every measured level (no client-limited level)."
