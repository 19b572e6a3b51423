"""Architecture facts of a model directory: parameter counts, weight bytes and KV-cache bytes
per token, from its HF `config.json` (Llama/Qwen3 GQA, Qwen3-MoE, DeepSeek MLA). The one
place that knows how many bytes a token of KV cache takes. Not for building directories."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .gguf import manifest_of

# Bytes per element of a KV-cache dtype (vLLM --kv-cache-dtype values and torch names).
KV_DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def _model_dtype_bytes(cfg: Mapping[str, Any]) -> int:
    dt = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16").lower().replace("torch.", "")
    if dt not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown model dtype {dt!r}; known: {sorted(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[dt]


def kv_bytes_per_token(facts_or_config: Mapping[str, Any], kv_dtype: str = "auto",
                       tensor_parallel_size: int = 1) -> int:
    """KV-cache bytes one token occupies, over all layers (per GPU when
    ``tensor_parallel_size`` > 1).

    * MHA/GQA: ``layers * 2 (K and V) * kv_heads * head_dim * dtype_bytes``; with tensor
      parallelism each rank holds ``max(1, kv_heads // tp)`` heads (KV heads are
      replicated when there are fewer than ranks).
    * MLA (DeepSeek V2/V3, recognised by ``kv_lora_rank``): one compressed latent plus the
      decoupled rope key per layer, ``layers * (kv_lora_rank + qk_rope_head_dim) *
      dtype_bytes`` -- no factor 2, and replicated on every TP rank (as vLLM and SGLang
      store it).

    ``facts_or_config`` is :func:`servelab.models.facts.model_facts` output (``num_layers``,
    ``num_kv_heads``, ``head_dim``, ``dtype``) or an HF ``config.json`` dict
    (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim`` or hidden/heads,
    ``torch_dtype``). ``kv_dtype`` "auto" means the model dtype (vLLM's default), "fp8*"
    one byte. E.g. Llama-3.1-8B bf16: 32 * 2 * 8 * 128 * 2 = 131072.
    """
    c = facts_or_config
    layers = int(c.get("num_layers") or c["num_hidden_layers"])
    if kv_dtype in (None, "auto"):
        nbytes = _model_dtype_bytes(c)
    else:
        key = str(kv_dtype).lower()
        if key not in KV_DTYPE_BYTES:
            raise ValueError(f"unknown kv_dtype {kv_dtype!r}; known: auto, {', '.join(sorted(KV_DTYPE_BYTES))}")
        nbytes = KV_DTYPE_BYTES[key]
    if c.get("kv_lora_rank"):
        return layers * (int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) * nbytes
    heads = int(c.get("num_heads") or c.get("num_attention_heads"))
    kv_heads = int(c.get("num_kv_heads") or c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    tp = max(1, int(tensor_parallel_size))
    per_rank_heads = max(1, kv_heads // tp)
    return layers * 2 * per_rank_heads * head_dim * nbytes


def _dense_mlp(cfg: dict[str, Any], hidden: int, inter: int) -> int:
    """Gate, up and down projections of one dense MLP (with biases when the config says so)."""
    return 3 * hidden * inter + (2 * inter + hidden if cfg.get("mlp_bias") else 0)


def _mla_attention(cfg: dict[str, Any], hidden: int, n_heads: int) -> tuple[int, dict[str, Any]]:
    """(parameters of one multi-head latent attention block, its head facts) -- DeepSeek's MLA."""
    q_lora = cfg.get("q_lora_rank")
    nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    v_dim, kv_lora = int(cfg["v_head_dim"]), int(cfg["kv_lora_rank"])
    qk_dim = nope + rope
    if q_lora:
        q_params = hidden * q_lora + q_lora + q_lora * n_heads * qk_dim
    else:
        q_params = hidden * n_heads * qk_dim
    attn_params = (
        q_params
        + hidden * (kv_lora + rope)  # kv_a_proj_with_mqa
        + kv_lora  # kv_a_layernorm
        + kv_lora * n_heads * (nope + v_dim)  # kv_b_proj
        + n_heads * v_dim * hidden  # o_proj
    )
    return attn_params, {"head_dim": qk_dim, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": v_dim,
                         "kv_lora_rank": kv_lora, "q_lora_rank": q_lora}


def _gqa_attention(cfg: dict[str, Any], hidden: int, n_heads: int, n_kv_heads: int) -> tuple[int, dict[str, Any]]:
    """(parameters of one grouped-query attention block, its head facts)."""
    model_type = cfg.get("model_type", "")
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    q_out, kv_out = n_heads * head_dim, n_kv_heads * head_dim
    attn_params = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    if cfg.get("attention_bias"):
        attn_params += q_out + 2 * kv_out + (hidden if model_type == "llama" else 0)
    if model_type in ("qwen3", "qwen3_moe"):
        attn_params += 2 * head_dim  # q_norm, k_norm
    return attn_params, {"head_dim": head_dim}


def _qwen3_moe_mlp(cfg: dict[str, Any], hidden: int, n_layers: int) -> tuple[int, int, int, int, int]:
    """(total, active MLP parameters, experts, active experts, shared experts) of Qwen3-MoE."""
    n_experts = int(cfg["num_experts"])
    n_active = int(cfg["num_experts_per_tok"])
    expert = 3 * hidden * int(cfg["moe_intermediate_size"])
    sparse_step = int(cfg.get("decoder_sparse_step", 1))
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    total = active = 0
    for i in range(n_layers):
        if i not in mlp_only and n_experts > 0 and (i + 1) % sparse_step == 0:
            router = hidden * n_experts
            total += n_experts * expert + router
            active += n_active * expert + router
        else:
            total += _dense_mlp(cfg, hidden, int(cfg["intermediate_size"]))
            active += _dense_mlp(cfg, hidden, int(cfg["intermediate_size"]))
    return total, active, n_experts, n_active, 0


def _mixtral_mlp(cfg: dict[str, Any], hidden: int, n_layers: int) -> tuple[int, int, int, int, int]:
    """(total, active MLP parameters, experts, active experts, shared experts) of Mixtral: every
    layer routes to `num_experts_per_tok` of `num_local_experts` experts of `intermediate_size`."""
    n_experts = int(cfg["num_local_experts"])
    n_active = int(cfg["num_experts_per_tok"])
    expert = 3 * hidden * int(cfg["intermediate_size"])
    router = hidden * n_experts
    return (n_layers * (n_experts * expert + router), n_layers * (n_active * expert + router), n_experts, n_active, 0)


def _deepseek_moe_mlp(cfg: dict[str, Any], hidden: int, n_layers: int) -> tuple[int, int, int, int, int]:
    """(total, active MLP parameters, experts, active experts, shared experts) of DeepSeek's MoE:
    dense for the first `first_k_dense_replace` layers, then routed + shared experts."""
    n_experts = int(cfg["n_routed_experts"])
    n_active = int(cfg["num_experts_per_tok"])
    n_shared = int(cfg.get("n_shared_experts") or 0)
    moe_inter = int(cfg["moe_intermediate_size"])
    expert = 3 * hidden * moe_inter
    shared = _dense_mlp(cfg, hidden, moe_inter * n_shared) if n_shared else 0
    first_dense = int(cfg.get("first_k_dense_replace", 0))
    freq = int(cfg.get("moe_layer_freq", 1))
    total = active = 0
    for i in range(n_layers):
        if i >= first_dense and i % freq == 0:
            router = n_experts * hidden
            if cfg.get("topk_method") == "noaux_tc":
                router += n_experts  # e_score_correction_bias
            total += n_experts * expert + shared + router
            active += n_active * expert + shared + router
        else:
            total += _dense_mlp(cfg, hidden, int(cfg["intermediate_size"]))
            active += _dense_mlp(cfg, hidden, int(cfg["intermediate_size"]))
    return total, active, n_experts, n_active, n_shared


def facts_from_config(cfg: dict[str, Any], *, vocab_size: int | None = None) -> dict[str, Any]:
    """Architecture facts and parameter counts from HF config fields.

    `vocab_size` overrides the config's (e.g. the real model's 128256 for a
    directory built with a 32000-token tokenizer). Counts cover embedding,
    lm_head (unless tied), per-layer attention, MLP or experts + router, and
    RMSNorm weights; biases are counted when the config enables them.
    """
    arch = (cfg.get("architectures") or [cfg.get("model_type", "?")])[0]
    model_type = cfg.get("model_type", "")
    vocab = int(vocab_size if vocab_size is not None else cfg["vocab_size"])
    hidden = int(cfg["hidden_size"])
    n_layers = int(cfg["num_hidden_layers"])
    n_heads = int(cfg["num_attention_heads"])
    n_kv_heads = int(cfg.get("num_key_value_heads") or n_heads)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    dtype_bytes = KV_DTYPE_BYTES.get(dtype.lower().replace("torch.", ""), 2)
    tied = bool(cfg.get("tie_word_embeddings", False))
    is_mla = "kv_lora_rank" in cfg

    embedding_params = vocab * hidden
    lm_head_params = 0 if tied else vocab * hidden
    final_norm_params = hidden
    layer_norm_params = 2 * hidden  # input + post-attention RMSNorm

    facts: dict[str, Any] = {
        "architecture": arch,
        "model_type": model_type,
        "hidden_size": hidden,
        "num_layers": n_layers,
        "num_heads": n_heads,
        "num_kv_heads": n_kv_heads,
        "vocab_size": vocab,
        "dtype": dtype,
        "tie_word_embeddings": tied,
        "max_position_embeddings": cfg.get("max_position_embeddings"),
    }
    attn_params, heads = (_mla_attention(cfg, hidden, n_heads) if is_mla
                          else _gqa_attention(cfg, hidden, n_heads, n_kv_heads))
    facts.update(heads)
    if model_type == "qwen3_moe":
        total_mlp, active_mlp, n_experts, n_active_experts, n_shared_experts = _qwen3_moe_mlp(cfg, hidden, n_layers)
    elif model_type == "mixtral":
        total_mlp, active_mlp, n_experts, n_active_experts, n_shared_experts = _mixtral_mlp(cfg, hidden, n_layers)
    elif is_mla and cfg.get("n_routed_experts"):
        total_mlp, active_mlp, n_experts, n_active_experts, n_shared_experts = _deepseek_moe_mlp(cfg, hidden, n_layers)
    else:
        total_mlp = active_mlp = n_layers * _dense_mlp(cfg, hidden, int(cfg["intermediate_size"]))
        n_experts = n_active_experts = n_shared_experts = 0

    per_layer_fixed = n_layers * (attn_params + layer_norm_params)
    outside_layers = embedding_params + lm_head_params + final_norm_params
    param_count = outside_layers + per_layer_fixed + total_mlp
    facts.update(
        param_count=param_count,
        embedding_param_count=embedding_params,
        lm_head_param_count=lm_head_params,
        weight_bytes=param_count * dtype_bytes,
        kv_cache_bytes_per_token=kv_bytes_per_token(cfg),
    )
    facts["num_moe_layers"] = moe_layers(cfg, n_layers) if n_experts else 0
    facts["attention"] = "mla" if is_mla else "gqa"
    if n_experts:
        facts.update(
            num_experts=n_experts,
            num_active_experts=n_active_experts,
            num_shared_experts=n_shared_experts,
            active_param_count=outside_layers + per_layer_fixed + active_mlp,
        )
    return facts


def moe_layers(cfg: Mapping[str, Any], n_layers: int) -> int:
    """How many of the layers route to experts (the rest have a dense MLP)."""
    mt = cfg.get("model_type", "")
    if mt == "qwen3_moe":
        step, only = int(cfg.get("decoder_sparse_step", 1)), set(cfg.get("mlp_only_layers") or [])
        return sum(1 for i in range(n_layers) if i not in only and (i + 1) % step == 0)
    if cfg.get("n_routed_experts"):
        first, freq = int(cfg.get("first_k_dense_replace", 0)), int(cfg.get("moe_layer_freq", 1))
        return sum(1 for i in range(n_layers) if i >= first and i % freq == 0)
    return n_layers


def model_facts(model_dir: Path, *, vocab_size: int | None = None) -> dict[str, Any]:
    """`facts_from_config` of ``model_dir/config.json`` (see there for `vocab_size`)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    facts = facts_from_config(cfg, vocab_size=vocab_size)
    manifest = manifest_of(Path(model_dir))
    facts["real_weights"] = bool(manifest.get("real_weights"))  # dummy presets: served with random weights
    if manifest.get("source", {}).get("description"):
        facts["description"] = manifest["source"]["description"]
    return facts
