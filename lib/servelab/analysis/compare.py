"""One change at a time: what differs between two configurations' engine settings, and
each configuration against its baseline on the levels both measured."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..engines.flags import json_value
from .stats import pct_change

DEFAULT_DIFF_IGNORE = ("host", "port", "startup_timeout_s")


def flatten(d: Any, prefix: str = "", empty: Any = None) -> dict[str, Any]:
    """Nested settings as {"a.b.c": value}; flag values given as JSON strings are parsed. An
    empty mapping becomes `empty` (None: "nothing set", so it compares equal to an unset key)."""
    d = json_value(d)
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k), empty))
        if not d and prefix:
            out[prefix] = empty
        return out
    return {prefix: d}


def config_diff(engine_params_a: Mapping[str, Any], engine_params_b: Mapping[str, Any],
                ignore: Iterable[str] = DEFAULT_DIFF_IGNORE) -> list[tuple[str, Any, Any]]:
    """Every setting that differs between two configurations: ``[(path, a, b)]`` sorted by
    path, where ``path`` joins nested keys with dots (``"args.max-num-batched-tokens"``,
    ``"args.compilation-config.cudagraph_mode"``, ``"env.VLLM_ATTENTION_BACKEND"``).

    Nested dicts -- and flag values given as JSON strings -- are flattened; lists compare
    as whole values. A missing key reads as None, and None/absent compare equal (an unset
    flag). Top-level ``ignore`` paths (default: host, port, startup timeout -- where the
    engine listens, not how it serves) are skipped.
    """
    ign = set(ignore)
    fa, fb = flatten(engine_params_a), flatten(engine_params_b)
    out = []
    for path in sorted(set(fa) | set(fb)):
        if path.split(".", 1)[0] in ign or path in ign:
            continue
        a, b = fa.get(path), fb.get(path)
        if a != b:
            out.append((path, a, b))
    return out


def compare_configs(study_configs: Sequence[tuple[str, Mapping[str, Any]]], summary: pd.DataFrame,
                    baselines: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Each configuration against its baseline (``baselines[config]``, default the previous one
    in study order), per level both measured.

    ``study_configs`` is ``[(config_id, engine_params), ...]`` (run.json ``engine_params``
    per configuration). Columns: config, baseline, changed ("path: a -> b; ..."),
    n_changed, bucket, concurrency, ttft_p50_change_pct, aggregate_change_pct,
    decode_change_pct (each ``(config - baseline) / baseline * 100``) and ``warning``:
    "not attributable: N variables differ: ..." when more than one setting changed,
    "nothing differs: ..." when none did (the change is run-to-run noise), else "".
    A configuration without levels shared with its baseline gets one row of NaNs.
    """
    cols = ["config", "baseline", "changed", "n_changed", "bucket", "concurrency", "ttft_p50_change_pct",
            "aggregate_change_pct", "decode_change_pct", "warning"]
    rows = []
    keys = [k for k in ["bucket", "target_input_tokens", "target_output_tokens", "concurrency"]
            if summary is not None and k in summary.columns]
    params = dict(study_configs)
    pairs = [((baselines or {}).get(cur_id, prev_id), cur_id)
             for (prev_id, _), (cur_id, _) in zip(study_configs, study_configs[1:])]
    for prev_id, cur_id in pairs:
        prev, cur = params[prev_id], params[cur_id]
        diff = config_diff(prev, cur)
        changed = "; ".join(f"{p}: {a!r} -> {b!r}" for p, a, b in diff)
        if len(diff) > 1:
            warning = f"not attributable: {len(diff)} variables differ: {', '.join(p for p, _, _ in diff)}"
        elif not diff:
            warning = "nothing differs: any change is run-to-run noise"
        else:
            warning = ""
        base = {"config": cur_id, "baseline": prev_id, "changed": changed, "n_changed": len(diff), "warning": warning}
        merged = pd.DataFrame()
        if summary is not None and not summary.empty:
            a = summary[summary["config"] == prev_id]
            b = summary[summary["config"] == cur_id]
            metrics = ["ttft_p50_s", "aggregate_output_tps", "decode_tps_p50"]
            merged = a[keys + metrics].merge(b[keys + metrics], on=keys, suffixes=("_a", "_b"))
        if merged.empty:
            rows.append({**base, "bucket": None, "concurrency": math.nan, "ttft_p50_change_pct": math.nan,
                         "aggregate_change_pct": math.nan, "decode_change_pct": math.nan})
            continue
        for _, r in merged.sort_values(["bucket", "concurrency"], kind="stable").iterrows():
            rows.append({**base, "bucket": r["bucket"], "concurrency": int(r["concurrency"]),
                         "ttft_p50_change_pct": pct_change(r["ttft_p50_s_b"], r["ttft_p50_s_a"]),
                         "aggregate_change_pct": pct_change(r["aggregate_output_tps_b"], r["aggregate_output_tps_a"]),
                         "decode_change_pct": pct_change(r["decode_tps_p50_b"], r["decode_tps_p50_a"])})
    return pd.DataFrame(rows, columns=cols)


def change_effects(summary: pd.DataFrame, rounds: pd.DataFrame, baselines: Mapping[str, str], *,
                   n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Each configuration against its baseline on the levels both measured (one row per change).

    `agg_change_pct` is the median over shared levels of the change in median aggregate tok/s
    (`(config - baseline) / baseline * 100`); its 95 % interval comes from a bootstrap over the
    measured rounds (each level's rounds resampled with replacement, `n_boot` times, a fixed
    seed so a report re-renders identically); `beyond_noise` is False when the interval
    crosses zero. `ttft_change_pct` is the median change of TTFT p50 over the same levels.
    `rounds` is `summary.round_throughput(records)`."""
    cols = ["config", "baseline", "levels", "agg_change_pct", "agg_ci_low_pct", "agg_ci_high_pct", "ttft_change_pct",
            "beyond_noise"]
    keys = ["bucket", "concurrency"]
    rng = np.random.default_rng(seed)
    rows = []
    for cur, base in baselines.items():
        a = summary[summary["config"] == base].set_index(keys)
        b = summary[summary["config"] == cur].set_index(keys)
        shared = [k for k in b.index if k in a.index]
        if not shared:
            continue
        agg = [pct_change(b.loc[k, "aggregate_output_tps"], a.loc[k, "aggregate_output_tps"]) for k in shared]
        ttft = [pct_change(b.loc[k, "ttft_p50_s"], a.loc[k, "ttft_p50_s"]) for k in shared]
        boots = []
        for k in shared:
            ra = _level_rounds(rounds, base, k)
            rb = _level_rounds(rounds, cur, k)
            if len(ra) == 0 or len(rb) == 0:
                continue
            ma = np.median(ra[rng.integers(0, len(ra), (n_boot, len(ra)))], axis=1)
            mb = np.median(rb[rng.integers(0, len(rb), (n_boot, len(rb)))], axis=1)
            boots.append((mb - ma) / ma * 100.0)
        lo = hi = math.nan
        if boots:
            dist = np.median(np.vstack(boots), axis=0)
            lo, hi = (float(x) for x in np.percentile(dist, [2.5, 97.5]))
        rows.append({"config": cur, "baseline": base, "levels": len(shared),
                     "agg_change_pct": float(np.nanmedian(agg)), "agg_ci_low_pct": lo, "agg_ci_high_pct": hi,
                     "ttft_change_pct": float(np.nanmedian(ttft)),
                     "beyond_noise": bool(math.isfinite(lo) and (lo > 0 or hi < 0))})
    return pd.DataFrame(rows, columns=cols)


def _level_rounds(rounds: pd.DataFrame, config: str, key: tuple[Any, Any]) -> np.ndarray:
    r = rounds[(rounds["config"] == config) & (rounds["bucket"] == key[0]) & (rounds["concurrency"] == key[1])]
    return r["aggregate_output_tps"].dropna().to_numpy(dtype=float)
