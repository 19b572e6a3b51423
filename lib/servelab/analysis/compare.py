"""One change at a time: what differs between two configurations' engine settings, and
each configuration against its baseline on the levels both measured."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
