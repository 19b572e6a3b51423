"""Architecture facts of a model directory: parameter counts by module kind, experts, weight bytes
and the KV cache's bytes per token, from its HF `config.json`. The counts come from the library
(`models.arch`: transformers builds the architecture on the meta device); this module adds the
serving arithmetic: weight bytes in the serving dtype (and a checkpoint's quantization), and the one
place that knows how many bytes a token of KV cache takes in the engine's accounting. An
architecture the library cannot build is refused (`arch.ArchitectureError`), never read as dense.
Not for building directories."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .arch import ArchitectureError, library_facts
from .gguf import manifest_of

# Bytes per element of a KV-cache dtype (vLLM --kv-cache-dtype values and torch names).
KV_DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

# Bytes per parameter of the routed experts of a quantized checkpoint, by quant_method: MXFP4 (gpt-oss)
# stores blocks of 32 4-bit values with one 8-bit scale, (32 * 0.5 + 1) / 32 bytes per parameter; fp8
# (block-wise, DeepSeek-V3 and the Qwen FP8 checkpoints) one byte for every projection (attention, MLP,
# experts), the embeddings, head, norms and router in the model dtype.
QUANT_BYTES: dict[str, tuple[float, tuple[str, ...]]] = {
    "mxfp4": (0.53125, ("routed_experts",)),
    "fp8": (1.0, ("attention", "linear_attention", "dense_mlp", "routed_experts", "shared_experts")),
}


def _model_dtype_bytes(cfg: Mapping[str, Any]) -> int:
    dt = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16").lower().replace("torch.", "")
    if dt not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown model dtype {dt!r}; known: {sorted(KV_DTYPE_BYTES)}")
    return 2 if dt == "float32" else KV_DTYPE_BYTES[dt]  # vLLM's dtype auto serves float32 in 16 bits


def _kv_dtype_bytes(c: Mapping[str, Any], kv_dtype: str | None) -> int:
    if kv_dtype in (None, "auto"):
        return _model_dtype_bytes(c)
    key = str(kv_dtype).lower()
    if key not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; known: auto, {', '.join(sorted(KV_DTYPE_BYTES))}")
    return KV_DTYPE_BYTES[key]


def kv_bytes_per_token(facts_or_config: Mapping[str, Any], kv_dtype: str = "auto",
                       tensor_parallel_size: int = 1) -> int:
    """KV-cache bytes one token occupies in the engine's pool, over all layers (per GPU when
    ``tensor_parallel_size`` > 1): what vLLM divides its KV memory by to report "GPU KV cache size:
    N tokens".

    * MHA/GQA: ``layers * 2 (K and V) * kv_heads * head_dim * dtype_bytes``; with tensor
      parallelism each rank holds ``max(1, kv_heads // tp)`` heads (KV heads are replicated when
      there are fewer than ranks).
    * MLA (DeepSeek V2/V3): one compressed latent plus the decoupled rope key per layer,
      ``layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes`` -- no factor 2, and replicated
      on every TP rank (as vLLM and SGLang store it).
    * Layers of several kinds (sliding-window and full attention, or attention and linear
      attention / SSM layers): vLLM's hybrid KV-cache manager puts the layers of each kind in
      groups of one size (the fewest layers of a kind, or the most when no kind has 1.5 times
      another's) and one block of every group shares a page, so its token count divides the memory
      by ``group_size * number_of_groups`` layer slots of one attention layer's bytes
      (`kv_layer_slots`): Gemma-2's 21 + 21 layers count as 42, Qwen3-Next's 12 attention and 36
      linear layers as 48 (read in vLLM's v1/core/kv_cache_utils.py). A sliding-window layer
      drops the tokens outside its window and a linear layer keeps a fixed state, so the real
      capacity for long prompts is larger than the reported one (`kv_full_layers` x the bytes of
      one layer is what a token of a long context really costs).

    ``facts_or_config`` is :func:`model_facts` output or an HF ``config.json`` dict (read through
    the library). ``kv_dtype`` "auto" means the model dtype (vLLM's default), "fp8*" one byte.
    E.g. Llama-3.1-8B bf16: 32 * 2 * 8 * 128 * 2 = 131072.
    """
    c = facts_or_config
    if "kv_layer_slots" not in c and "num_layers" not in c:  # a config.json: its facts from the library
        c = facts_from_config(dict(c))
    nbytes = _kv_dtype_bytes(c, kv_dtype)
    tp = max(1, int(tensor_parallel_size))
    if "kv_layer_slots" in c:
        elems = int(c["kv_cache_elems_per_token"])
        if c.get("attention") == "mla" or not elems:
            return elems * nbytes
        kv_heads = int(c["num_kv_heads"])
        return elems * max(1, kv_heads // tp) // kv_heads * nbytes
    # facts recorded before the library counted them (run.json of older runs): GQA or MLA on every layer
    layers = int(c["num_layers"])
    if c.get("kv_lora_rank"):
        return layers * (int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) * nbytes
    heads = int(c["num_heads"])
    kv_heads = int(c.get("num_kv_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    return layers * 2 * max(1, kv_heads // tp) * head_dim * nbytes


def kv_read_bytes_per_token(facts: Mapping[str, Any], ctx: float, kv_dtype: str = "auto",
                            tensor_parallel_size: int = 1) -> float:
    """KV bytes a decode step reads per token of a sequence's context of `ctx` tokens, averaged: a
    full-attention layer reads every token, a sliding-window layer at most its window, a linear or
    SSM layer none (its fixed state per request is not counted). Facts without a layout (older run
    records) and models whose every layer keeps every token: `kv_bytes_per_token`."""
    pool = kv_bytes_per_token(facts, kv_dtype, tensor_parallel_size)
    counts = facts.get("kv_layers") or {}
    slots = int(facts.get("kv_layer_slots") or 0)
    if not slots or ctx <= 0 or set(counts) <= {"full_attention"}:
        return float(pool)
    per_layer = pool / slots
    window = float(facts.get("sliding_window") or ctx)
    full, sliding = counts.get("full_attention", 0), counts.get("sliding_attention", 0)
    return per_layer * (full * ctx + sliding * min(ctx, window)) / ctx


def kv_layout(types: list[str], per_layer: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The KV cache's layout from the layer kinds and the attention layers' KV elements per token:
    the kinds' counts, vLLM's layer slots (see `kv_bytes_per_token`) and the elements per token."""
    counts = Counter(types)
    if not per_layer:
        return {"kv_layers": dict(counts), "kv_layer_slots": 0, "kv_cache_elems_per_token": 0, "kv_full_layers": 0}
    elems = max(int(x["elems"]) for x in per_layer)
    if len(counts) == 1:
        slots, total = len(per_layer), sum(int(x["elems"]) for x in per_layer)
    else:
        lo, hi = min(counts.values()), max(counts.values())
        group = hi if hi < 1.5 * lo else lo
        slots = group * sum(math.ceil(n / group) for n in counts.values())
        total = slots * elems
    return {"kv_layers": dict(counts), "kv_layer_slots": slots, "kv_cache_elems_per_token": total,
            "kv_full_layers": counts.get("full_attention", 0), "kv_elems_per_layer": elems}


def _weight_bytes(cfg: Mapping[str, Any], lib: Mapping[str, Any], dtype_bytes: int) -> tuple[int, str | None]:
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method") or "").lower() or None
    if method is None:
        return int(lib["param_count"]) * dtype_bytes, None
    if method not in QUANT_BYTES:
        raise ArchitectureError(f"{lib['architecture']}: a {method} checkpoint; servelab models the weight bytes of "
                                f"{', '.join(QUANT_BYTES)} checkpoints and of unquantized ones only")
    per, kinds = QUANT_BYTES[method]
    quantized = sum(int(lib["params_by_kind"][k]) for k in kinds)
    return int(round(quantized * per + (int(lib["param_count"]) - quantized) * dtype_bytes)), method


def facts_from_config(cfg: dict[str, Any], *, vocab_size: int | None = None) -> dict[str, Any]:
    """Architecture facts and parameter counts of an HF config.

    `vocab_size` overrides the config's (e.g. the real model's 128256 for a directory built with a
    32000-token tokenizer). Parameters are the library's (`arch.library_facts`): embedding, lm_head
    (unless tied), attention, dense MLP, routed and shared experts, router, norms, by kind in
    `params_by_kind`; `active_param_count` (MoE only) takes top-k of each MoE layer's experts.
    """
    if vocab_size is not None:
        cfg = {**cfg, "vocab_size": int(vocab_size)}
    lib = library_facts(cfg)
    kinds = lib["params_by_kind"]
    n_heads = int(cfg.get("num_attention_heads") or 0)
    kv = lib["kv_per_layer"]
    is_mla = bool(kv) and bool(kv[0]["mla"])
    dtype_bytes = _model_dtype_bytes({"dtype": lib["dtype"]})
    facts: dict[str, Any] = {
        "architecture": lib["architecture"],
        "model_type": lib["model_type"],
        "hidden_size": int(cfg["hidden_size"]),
        "num_layers": lib["num_layers"],
        "num_heads": n_heads,
        "num_kv_heads": int(kv[0]["kv_heads"]) if kv and not is_mla else int(cfg.get("num_key_value_heads") or n_heads),
        "vocab_size": int(cfg["vocab_size"]),
        "dtype": lib["dtype"],
        "tie_word_embeddings": lib["tie_word_embeddings"],
        "max_position_embeddings": cfg.get("max_position_embeddings"),
    }
    if is_mla:
        nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
        facts.update(head_dim=nope + rope, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                     v_head_dim=int(cfg["v_head_dim"]), kv_lora_rank=int(cfg["kv_lora_rank"]),
                     q_lora_rank=cfg.get("q_lora_rank"))
    else:
        facts["head_dim"] = int(kv[0]["head_dim"]) if kv else int(cfg.get("head_dim") or cfg["hidden_size"] // n_heads)
    weight_bytes, quant = _weight_bytes(cfg, lib, dtype_bytes)
    facts.update(
        param_count=lib["param_count"],
        embedding_param_count=int(kinds["embedding"]),
        lm_head_param_count=int(kinds["lm_head"]),
        params_by_kind=dict(kinds),
        weight_bytes=weight_bytes,
        quantization=quant,
        attention="mla" if is_mla else "gqa",
        sliding_window=cfg.get("sliding_window") if "sliding_attention" in lib["layer_types"] else None,
        **kv_layout(lib["layer_types"], kv),
        kv_source=kv[0]["from"] if kv else "no attention layer",
        num_moe_layers=int(lib.get("num_moe_layers") or 0),
        facts_source=lib["source"],
    )
    facts["kv_cache_bytes_per_token"] = kv_bytes_per_token(facts)
    if lib.get("num_moe_layers"):
        facts.update(num_experts=lib["num_experts"], num_active_experts=lib["num_active_experts"],
                     num_shared_experts=lib["num_shared_experts"], active_param_count=lib["active_param_count"])
    return facts


def model_facts(model_dir: Path, *, vocab_size: int | None = None) -> dict[str, Any]:
    """`facts_from_config` of ``model_dir/config.json`` (see there for `vocab_size`)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    facts = facts_from_config(cfg, vocab_size=vocab_size)
    manifest = manifest_of(Path(model_dir))
    facts["real_weights"] = bool(manifest.get("real_weights"))  # dummy presets: served with random weights
    if manifest.get("source", {}).get("description"):
        facts["description"] = manifest["source"]["description"]
    return facts
