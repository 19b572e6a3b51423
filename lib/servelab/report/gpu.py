"""GPU telemetry in the write-up: per configuration, from its `gpu_metrics.jsonl` (NVML samples of
the engine's GPUs tagged with the load level, `measure.gpu.GpuSampler`), the peak GPU memory in
use, mean board power, mean GPU busy share and energy per output token at each level
(`measure.gpu.energy_per_level`); and an engine comparison (vLLM against SGLang) at the levels
the engines' configurations share. Pure functions of the published files.

Definitions (measure/gpu.py): power and energy are the whole board's (idle, prefill and the
warmup round included in a level's window); J/token = the level's energy over the output tokens
of its successful requests, warmup included; "GPU busy" is NVML's utilization.gpu, the share of
the sample period in which a kernel ran (not SM occupancy: a GPU can be busy with one small
kernel). Memory is what NVML reports used on the device (the engine's static pool, CUDA graphs
and the context; SGLang's `mem-fraction-static` and vLLM's `gpu-memory-utilization` reserve most
of it at start, so it barely moves with load)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .. import engines
from ..measure.gpu import energy_per_level, load_gpu_samples
from ..runfolder import GPU_METRICS

GIB = 1024 ** 3
LEVEL_COLUMNS = ["config", "engine", "bucket", "concurrency", "level", "duration_s", "power_w_mean", "power_w_max",
                 "energy_j", "energy_method", "output_tokens", "j_per_output_token", "mem_used_gib_max",
                 "gpu_util_pct_mean"]
CONFIG_COLUMNS = ["config", "label", "engine", "gpus", "samples", "gpu_mem_used_gib_peak", "gpu_mem_total_gib",
                  "power_w_mean", "power_w_max", "gpu_util_pct_mean", "energy_method", "j_per_output_token_min",
                  "j_per_output_token_max"]
COMPARE_COLUMNS = ["bucket", "concurrency", "config", "engine", "aggregate_output_tps", "ttft_p50_s", "decode_tps_p50",
                   "j_per_output_token", "aggregate_vs_reference", "reference"]


def _engine(sd: Any, cid: str) -> str:
    try:
        return str(sd.engine_params(cid).get("kind") or "")
    except (KeyError, AttributeError):
        return None


def _samples(sd: Any, cid: str) -> pd.DataFrame | None:
    p = sd.folders[cid].path / GPU_METRICS
    if not p.exists():
        return None
    df = load_gpu_samples(p)
    return df if df.attrs.get("available") else None


def _split_level(level: str) -> tuple[str, int | None]:
    bucket, _, c = str(level).rpartition(" c=")
    try:
        return bucket, int(c)
    except ValueError:
        return str(level), None


def gpu_levels(sd: Any) -> pd.DataFrame:
    """One row per configuration and load level: power, energy, J per output token, memory, busy."""
    frames = []
    for cid in sd.config_ids:
        s = _samples(sd, cid)
        if s is None:
            continue
        e = energy_per_level(s, sd.folders[cid].records)
        if e.empty:
            continue
        split = [_split_level(lv) for lv in e["level"]]
        e = e.assign(config=cid, engine=_engine(sd, cid), bucket=[b for b, _ in split],
                     concurrency=[c for _, c in split])
        frames.append(e)
    if not frames:
        return pd.DataFrame(columns=LEVEL_COLUMNS)
    return pd.concat(frames, ignore_index=True)[LEVEL_COLUMNS]


def gpu_configs(sd: Any, levels: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per configuration with telemetry: peak memory (whole file, start-up idle included),
    mean and peak board power and mean GPU busy share over its levels, J/token range."""
    levels = gpu_levels(sd) if levels is None else levels
    labels = sd.labels()
    rows = []
    for cid in sd.config_ids:
        s = _samples(sd, cid)
        if s is None:
            continue
        lv = s[s["level"].notna()]
        per_tick = s.groupby("seq").agg(mem=("mem_used_bytes", "sum"), total=("mem_total_bytes", "sum"))
        el = levels[levels["config"] == cid]
        rows.append({
            "config": cid, "label": labels.get(cid, cid), "engine": _engine(sd, cid), "gpus": int(s["index"].nunique()),
            "samples": int(s["seq"].nunique()), "gpu_mem_used_gib_peak": float(per_tick["mem"].max() / GIB),
            "gpu_mem_total_gib": float(per_tick["total"].max() / GIB),
            "power_w_mean": float(lv.groupby("index")["power_w"].mean().sum()) if len(lv) else float("nan"),
            "power_w_max": float(el["power_w_max"].max()) if len(el) else float("nan"),
            "gpu_util_pct_mean": float(lv["gpu_util_pct"].mean()) if len(lv) else float("nan"),
            "energy_method": ",".join(sorted(set(el["energy_method"]))) if len(el) else "",
            "j_per_output_token_min": float(el["j_per_output_token"].min()) if len(el) else float("nan"),
            "j_per_output_token_max": float(el["j_per_output_token"].max()) if len(el) else float("nan"),
        })
    return pd.DataFrame(rows, columns=CONFIG_COLUMNS)


def engine_comparison_table(sd: Any, configs: list[str] | None = None, reference: str | None = None) -> pd.DataFrame:
    """vLLM against SGLang at the levels every compared configuration measured: one row per
    (bucket, concurrency, configuration) with aggregate output tok/s, TTFT p50, decode tok/s p50
    (per stream) and J per output token, and the aggregate tok/s relative to the reference
    configuration (default: the first configuration of the registry's first engine, vLLM). `configs` default: every
    configuration of the main grid whose engine is vLLM or SGLang (saturation sweeps, whose
    levels are a subset, are left out unless named)."""
    summ = sd.summary
    if summ.empty:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    kinds = {cid: _engine(sd, cid) for cid in sd.config_ids}
    levels_of = {cid: set(map(tuple, summ[summ["config"] == cid][["bucket", "concurrency"]].to_numpy().tolist()))
                 for cid in sd.config_ids}
    if configs is None:
        biggest = max((len(v) for v in levels_of.values()), default=0)
        configs = [c for c in sd.config_ids if kinds[c] in engines.KINDS and len(levels_of[c]) == biggest]
    if len({kinds[c] for c in configs}) < 2:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    reference = reference or next((c for c in configs if kinds[c] == engines.KINDS[0]), configs[0])
    shared = set.intersection(*(levels_of[c] for c in configs))
    energy = gpu_levels(sd)
    jpt = {(r.config, r.bucket, r.concurrency): r.j_per_output_token for r in energy.itertuples()}
    s = summ[summ["config"].isin(configs)].set_index(["config", "bucket", "concurrency"])
    rows = []
    bucket_order = list(dict.fromkeys(summ["bucket"]))
    for bucket, conc in sorted(shared, key=lambda bc: (bucket_order.index(bc[0]), bc[1])):
        ref_tps = s.loc[(reference, bucket, conc), "aggregate_output_tps"]
        for cid in configs:
            r = s.loc[(cid, bucket, conc)]
            rows.append({"bucket": bucket, "concurrency": int(conc), "config": cid, "engine": kinds[cid],
                         "aggregate_output_tps": float(r["aggregate_output_tps"]), "ttft_p50_s": float(r["ttft_p50_s"]),
                         "decode_tps_p50": float(r["decode_tps_p50"]),
                         "j_per_output_token": float(jpt.get((cid, bucket, int(conc)), float("nan"))),
                         "aggregate_vs_reference": float(r["aggregate_output_tps"] / ref_tps) if ref_tps else float("nan"),
                         "reference": reference})
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def gpu_tables(sd: Any) -> tuple[str, list[Any]]:
    """(text, captioned tables) of the GPU telemetry for the write-up: per configuration the
    peak GPU memory, power and busy share, and J per output token at each level; nothing when
    no configuration has telemetry (a CPU study)."""
    from . import html

    levels = gpu_levels(sd)
    conf = gpu_configs(sd, levels)
    if conf.empty:
        return "", []
    text = sd.w("gpu.intro")
    c = sd.w("gpu.columns")
    t1 = pd.DataFrame({c[0]: conf["config"], c[1]: conf["engine"], c[2]: conf["gpu_mem_used_gib_peak"],
                       c[3]: conf["gpu_mem_total_gib"], c[4]: conf["power_w_mean"], c[5]: conf["power_w_max"],
                       c[6]: conf["gpu_util_pct_mean"]})
    tables = [html.table(t1, sd.w("gpu.caption"), formats={c[2]: "{:,.1f}", c[3]: "{:,.1f}", c[4]: "{:,.0f}",
                                                    c[5]: "{:,.0f}", c[6]: "{:,.0f}"})]
    jcols = sd.w("gpu.energy_columns")
    lv = levels.dropna(subset=["j_per_output_token"])
    if len(lv):
        piv = lv.pivot_table(index=["bucket", "concurrency"], columns="config", values="j_per_output_token",
                             aggfunc="first", sort=False).reset_index()
        piv.columns = [jcols[1], jcols[2], *piv.columns[2:]]
        tables.append(html.table(piv, sd.w("gpu.energy_caption"), formats={k: "{:,.3f}" for k in piv.columns[2:]},
                               notes={html.MISSING: sd.w("table.not_measured_at_level")}
                               if piv.isna().to_numpy().any() else None))
    return text, tables


def comparison_table(sd: Any) -> Any:
    """vLLM against SGLang at the levels both measured (empty when the study has one engine)."""
    from . import html

    t = engine_comparison_table(sd)
    if t.empty:
        return None
    c = sd.w("gpu.compare_columns")
    v = pd.DataFrame({c[0]: [f"{b} c={int(k)}" for b, k in zip(t["bucket"], t["concurrency"])], c[1]: t["config"],
                      c[2]: t["engine"], c[3]: t["aggregate_output_tps"], c[4]: t["ttft_p50_s"] * 1000,
                      c[5]: t["decode_tps_p50"], c[6]: t["j_per_output_token"],
                      c[7]: [f"{x:,.3f}×" for x in t["aggregate_vs_reference"]]})
    return html.table(v, sd.w("gpu.compare_caption", reference=t["reference"].iloc[0]),
                    formats={c[3]: "{:,.1f}", c[4]: "{:,.1f}", c[5]: "{:,.1f}", c[6]: "{:,.3f}"},
                    notes={html.MISSING: sd.w("gpu.no_telemetry")} if v.isna().to_numpy().any() else None)
