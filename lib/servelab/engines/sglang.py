"""SGLang's engine profile: its launcher command line, flag conflicts, the derived
`cuda-graph-max-bs*` value, server facts from `/get_server_info` (SGLang has no `/version`:
404 on 0.5.16; `/get_server_info` is a deprecated alias of `/server_info`, both answer with the
server args plus `version`, `max_total_num_tokens`, `cuda_graph_config` and `internal_states`),
and its `/metrics` names (only served with `--enable-metrics`; `sglang/srt/metrics/collector.py`).

Names as recorded from SGLang 0.5.16 on an H200 (tests/fixtures/sglang-0.5.16/, label set
engine_type, model_name, moe_ep_rank, pp_rank, tp_rank): `sglang:token_usage` (0..1 of the KV
pool), `sglang:max_total_num_tokens`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
`sglang:cache_hit_rate`, `sglang:spec_accept_length` (and `spec_accept_rate`, which ServerSample
has no field for), counters `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`,
`sglang:cached_tokens_total` (prompt tokens served from the radix cache; the series appears only
with the first hit, so a scrape that has the prompt-token counter but no cached-tokens series
means 0 cached tokens), histograms `sglang:time_to_first_token_seconds`,
`sglang:inter_token_latency_seconds`, `sglang:e2e_request_latency_seconds`,
`sglang:queue_time_seconds`. `sglang:num_retracted_reqs` is a per-interval gauge; 0.5.16 has no
cumulative retraction counter (`sglang:num_retracted_requests_total` of later versions is read
when present). Series that differ only in `tp_rank` are mirrors of one scheduler and are counted
once."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .base import ACTIVATION_ALLOWANCE_BYTES, EngineProfile, Layout, python_executable
from .flags import AUTO, flag_on, get_flag, norm
from .prom import (
    ServerSample,
    counter_names,
    dedup_tp,
    first_series,
    histogram,
    to_int,
    mean_of,
    Series,
    sum_of,
)

if TYPE_CHECKING:  # a profile takes schema.EngineParams; schema validates flags through the profiles
    from ..schema import EngineParams

SGLANG_CUDA_GRAPH_BACKENDS = {"full", "breakable", "disabled"}
SGLANG_SPEC_OPTIONS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens",
                       "speculative-dspark-block-size", "speculative-draft-model-path",
                       "speculative-dflash-block-size")

EQUIVALENTS = {
    "max-num-seqs": "max-running-requests",
    "max-num-batched-tokens": "chunked-prefill-size",
    "max-model-len": "context-length",
    "gpu-memory-utilization": "mem-fraction-static",
    "enforce-eager": "cuda-graph-backend-decode: disabled and cuda-graph-backend-prefill: disabled",
    "compilation-config": "cuda-graph-backend-decode / cuda-graph-backend-prefill / cuda-graph-max-bs-decode",
    "speculative-config": "speculative-algorithm (with speculative-num-steps, speculative-dspark-block-size, ...)",
    "enable-prefix-caching": "nothing: the radix cache is on by default",
    "no-enable-prefix-caching": "disable-radix-cache",
    "enable-expert-parallel": "ep-size",
    "pipeline-parallel-size": "pp-size",
    "enable-auto-tool-choice": "nothing: tool-call-parser alone enables tool calls",
    "tokenizer-mode": "tokenizer-mode (SGLang accepts auto|slow only)",
}

MAX_BS_FLAGS = ("cuda-graph-max-bs-decode", "cuda-graph-max-bs")


def sglang_spec_tokens(args: dict[str, Any]) -> int:
    """Draft tokens verified per step: DSpark's block size gamma (the verify window is gamma + 1),
    else speculative-num-draft-tokens - 1, else speculative-num-steps; 0 without speculation."""
    if not flag_on(args, "speculative-algorithm"):
        return 0
    for flag, minus in (("speculative-dspark-block-size", 0), ("speculative-num-draft-tokens", 1),
                        ("speculative-num-steps", 0)):
        v = get_flag(args, flag)
        if isinstance(v, int) and not isinstance(v, bool):
            return max(v - minus, 0)
    return 0


def _sglang_conflicts(args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
    errs: list[str] = []
    dec = get_flag(args, "cuda-graph-backend-decode")
    pre = get_flag(args, "cuda-graph-backend-prefill")
    for name, v in (("cuda-graph-backend-decode", dec), ("cuda-graph-backend-prefill", pre)):
        if v is not None and v is not False and str(v) not in SGLANG_CUDA_GRAPH_BACKENDS:
            errs.append(f"{name}: {v!r} is not one of {sorted(SGLANG_CUDA_GRAPH_BACKENDS)}")
    if flag_on(args, "disable-cuda-graph") and ((dec not in (None, False, "disabled")) or (pre not in (None, False, "disabled"))):
        errs.append("disable-cuda-graph conflicts with a cuda-graph-backend-* other than 'disabled'")
    if flag_on(args, "disable-decode-cuda-graph") and dec not in (None, False, "disabled"):
        errs.append(f"disable-decode-cuda-graph conflicts with cuda-graph-backend-decode: {dec}")
    if flag_on(args, "disable-prefill-cuda-graph") and pre not in (None, False, "disabled"):
        errs.append(f"disable-prefill-cuda-graph conflicts with cuda-graph-backend-prefill: {pre}")
    decode_off = dec == "disabled" or flag_on(args, "disable-cuda-graph") or flag_on(args, "disable-decode-cuda-graph")
    max_bs = get_flag(args, "cuda-graph-max-bs-decode")
    if decode_off and max_bs not in (None, False):
        errs.append("cuda-graph-max-bs-decode is set but the decode CUDA graph is disabled")
    if isinstance(max_bs, str) and max_bs != AUTO and not re.fullmatch(r"\d+", max_bs):
        pass  # reported by the value check
    if not flag_on(args, "speculative-algorithm"):
        for opt in SGLANG_SPEC_OPTIONS:
            if flag_on(args, opt):
                errs.append(f"{opt} needs speculative-algorithm")
    else:
        algo = str(get_flag(args, "speculative-algorithm")).upper()
        if flag_on(args, "speculative-dspark-block-size") and algo != "DSPARK":
            errs.append(f"speculative-dspark-block-size is a DSPARK option, speculative-algorithm is {algo}")
        bs = get_flag(args, "speculative-dspark-block-size")
        if isinstance(bs, int) and not isinstance(bs, bool) and bs <= 0:
            errs.append(f"speculative-dspark-block-size: expected a positive integer, got {bs}")
    mfs = get_flag(args, "mem-fraction-static")
    if isinstance(mfs, (int, float)) and not isinstance(mfs, bool) and not 0 < mfs < 1:
        errs.append(f"mem-fraction-static: expected 0 < x < 1, got {mfs}")
    tp, ep = get_flag(args, "tp-size", get_flag(args, "tensor-parallel-size")), get_flag(args, "ep-size")
    if isinstance(tp, int) and isinstance(ep, int) and ep > 1 and tp % ep:
        errs.append(f"ep-size {ep} must divide tp-size {tp}")
    if concurrency is not None and isinstance(max_bs, int) and not isinstance(max_bs, bool) and not decode_off:
        conc = [int(c) for c in concurrency]
        if conc and max(conc) > max_bs:
            errs.append(f"cuda-graph-max-bs-decode {max_bs} < concurrency {max(conc)}: larger decode batches run "
                        "without a CUDA graph; raise it or use 'auto'")
    return errs


def parse_sglang_metrics(idx: Mapping[str, Series]) -> ServerSample:
    def get(names: Iterable[str]) -> Series | None:
        series = first_series(idx, names)
        return dedup_tp(series) if series else None

    s = ServerSample(engine="sglang")
    s.kv_usage_frac = mean_of(get(["sglang:token_usage"]))
    s.kv_capacity_tokens = to_int(sum_of(get(["sglang:max_total_num_tokens"])))
    s.running = to_int(sum_of(get(["sglang:num_running_reqs"])))
    s.waiting = to_int(sum_of(get(["sglang:num_queue_reqs"])))
    s.preemptions_total = sum_of(get(counter_names("sglang:num_retracted_requests")))
    s.retracted_reqs = to_int(sum_of(get(["sglang:num_retracted_reqs"])))
    s.cache_hit_rate = mean_of(get(["sglang:cache_hit_rate"]))
    s.spec_accept_length = mean_of(get(["sglang:spec_accept_length"]))
    s.prompt_tokens_total = sum_of(get(counter_names("sglang:prompt_tokens")))
    s.generation_tokens_total = sum_of(get(counter_names("sglang:generation_tokens")))
    s.prefix_cache_hits_total = sum_of(get(counter_names("sglang:cached_tokens")))
    if s.prefix_cache_hits_total is None and s.prompt_tokens_total is not None:
        s.prefix_cache_hits_total = 0.0  # the counter series appears with the first cache hit
    s.ttft_sum_s, s.ttft_count = histogram(idx, ["sglang:time_to_first_token_seconds"], tp_dedup=True)
    s.itl_sum_s, s.itl_count = histogram(idx, ["sglang:inter_token_latency_seconds"], tp_dedup=True)
    s.e2e_sum_s, s.e2e_count = histogram(idx, ["sglang:e2e_request_latency_seconds"], tp_dedup=True)
    s.queue_sum_s, s.queue_count = histogram(idx, ["sglang:queue_time_seconds"], tp_dedup=True)
    return s


class SglangProfile(EngineProfile):
    kind = "sglang"
    eager_flag = "disable-cuda-graph"
    label = "SGLang"
    metrics_prefix = "sglang:"
    env_prefix = "SGLANG_"
    owned = {"model-path": "engine.model", "model": "engine.model", "host": "engine.host",
             "port": "engine.port", "load-format": "engine.load_format", "api-key": "engine.api_key_env"}
    equivalents = EQUIVALENTS
    auto_flags = MAX_BS_FLAGS
    info_paths = ("/get_server_info", "/server_info")

    def command(self, p: EngineParams, model_dir: str, python: str | None = None) -> list[str]:
        cmd = [python_executable(python), "-m", "sglang.launch_server", "--model-path", model_dir,
               "--host", p.host, "--port", str(p.port)]
        if p.load_format:
            cmd += ["--load-format", p.load_format]
        if p.api_key_env:  # SGLang takes the key only as a flag; records scrub its value
            cmd += ["--api-key", os.environ.get(p.api_key_env, f"${p.api_key_env}")]
        return cmd + self.flag_args(p.args)

    def conflicts(self, args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
        return _sglang_conflicts(args, concurrency)

    def layout(self, args: dict[str, Any]) -> Layout:
        """SGLang's experts split over ep-size GPUs of the TP group; with enable-dp-attention the DP
        ranks split the attention inside the TP group (no extra GPUs), else each is a replica of tp-size GPUs."""
        lay = super().layout(args)
        ep = get_flag(args, "ep-size")
        return Layout(lay.tp, lay.pp, lay.dp, int(ep) if ep else 1, flag_on(args, "enable-dp-attention"))

    def layout_problems(self, args: dict[str, Any]) -> list[str]:
        out = super().layout_problems(args)
        lay = self.layout(args) if not out else None
        if lay and lay.dp_attention and lay.tp % lay.dp:
            out.append(f"enable-dp-attention: dp-size {lay.dp} must divide tp-size {lay.tp} (the DP ranks share the TP "
                       "group's GPUs)")
        return out

    def spec_tokens(self, args: dict[str, Any]) -> int:
        return sglang_spec_tokens(args)

    def speculative(self, args: dict[str, Any]) -> bool:
        return flag_on(args, "speculative-algorithm")

    def forced_kv_tokens(self, args: Mapping[str, Any]) -> tuple[float, str] | None:
        tokens = get_flag(args, "max-total-tokens")
        return (float(tokens), "max-total-tokens") if tokens else None

    def gpu_memory(self, args: Mapping[str, Any], total_bytes: float, weight_bytes: float | None,
                   kv_bytes_per_token: float | None) -> tuple[float | None, str]:
        """SGLang holds mem-fraction-static x the GPU's memory for weights and KV pool (about 0.85 by default on
        80-141 GB GPUs; it sizes the pool from the memory it finds free); max-total-tokens caps the pool."""
        gib = 2.0**30
        tp = max(1, self.layout(dict(args)).tp)
        tokens = get_flag(args, "max-total-tokens")
        if tokens and weight_bytes is not None and kv_bytes_per_token:
            own = weight_bytes / tp + float(tokens) * kv_bytes_per_token / tp + ACTIVATION_ALLOWANCE_BYTES
            return own, (f"weights {weight_bytes / tp / gib:.1f} GiB + max-total-tokens {tokens} x "
                         f"{kv_bytes_per_token:.0f} B + {ACTIVATION_ALLOWANCE_BYTES / gib:g} GiB allowance")
        frac = get_flag(args, "mem-fraction-static")
        share = float(frac) if frac is not None else 0.85
        return share * total_bytes, (f"mem-fraction-static {share:g}{'' if frac is not None else ' (about its default)'}"
                                     f" x {total_bytes / gib:.1f} GiB")

    def calibration_args(self, eager: bool, gpu: bool) -> dict[str, Any]:
        return {"context-length": 1024, "max-running-requests": 4, "max-total-tokens": 16384,
                "mem-fraction-static": 0.05, "disable-cuda-graph": eager}

    def apply_derived(self, args: dict[str, Any], concurrency: Iterable[int]) -> dict[str, Any]:
        """cuda-graph-max-bs(-decode): auto -> max(c) (SGLang counts requests per decode batch and
        multiplies in the speculative verify width itself, so concurrency 1 gives 1)."""
        out = dict(args)
        for key, val in args.items():
            if norm(key) in MAX_BS_FLAGS and val == AUTO:
                out[key] = max(int(c) for c in concurrency)
        return out

    def describe(self, args: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
        dec = get_flag(args, "cuda-graph-backend-decode")
        off = dec == "disabled" or flag_on(args, "disable-cuda-graph")
        algo = get_flag(args, "speculative-algorithm")
        return {**super().describe(args, env),
                "cuda_graph": "eager" if off else f"decode {dec or 'default'}",
                "capture_sizes": next((get_flag(args, f) for f in MAX_BS_FLAGS if get_flag(args, f) is not None), None),
                "speculative": f"{algo} k={sglang_spec_tokens(args)}" if flag_on(args, "speculative-algorithm") else None,
                "prefix_cache": not flag_on(args, "disable-radix-cache")}

    def parse_metrics(self, idx: Mapping[str, Series]) -> ServerSample:
        return parse_sglang_metrics(idx)
