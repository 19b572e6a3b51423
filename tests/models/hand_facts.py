"""The hand formulas servelab counted parameters with before it asked the library (models/facts.py up
to issue #43), kept as a cross-check of `models.arch`: Llama/Qwen3 GQA, Qwen3-MoE, Mixtral and
DeepSeek's MLA + MoE, each written from the architecture's paper and modelling code. Not a module of
the library: nothing in lib/ may count parameters by hand again."""

from __future__ import annotations

from typing import Any


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


def hand_counts(cfg: dict[str, Any]) -> dict[str, int]:
    """Total and active parameters, experts, top-k and shared experts of one config, by hand."""
    model_type = cfg.get("model_type", "")
    vocab, hidden = int(cfg["vocab_size"]), int(cfg["hidden_size"])
    n_layers, n_heads = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv_heads = int(cfg.get("num_key_value_heads") or n_heads)
    tied = bool(cfg.get("tie_word_embeddings", False))
    attn, _ = (_mla_attention(cfg, hidden, n_heads) if "kv_lora_rank" in cfg
               else _gqa_attention(cfg, hidden, n_heads, n_kv_heads))
    if model_type == "qwen3_moe":
        total_mlp, active_mlp, e, k, s = _qwen3_moe_mlp(cfg, hidden, n_layers)
    elif model_type == "mixtral":
        total_mlp, active_mlp, e, k, s = _mixtral_mlp(cfg, hidden, n_layers)
    elif "kv_lora_rank" in cfg and cfg.get("n_routed_experts"):
        total_mlp, active_mlp, e, k, s = _deepseek_moe_mlp(cfg, hidden, n_layers)
    elif model_type in ("llama", "qwen3", "mistral"):
        total_mlp = active_mlp = n_layers * _dense_mlp(cfg, hidden, int(cfg["intermediate_size"]))
        e = k = s = 0
    else:
        raise KeyError(f"no hand formula for {model_type}")
    outside = vocab * hidden * (1 if tied else 2) + hidden  # embedding, lm_head, final norm
    fixed = outside + n_layers * (attn + 2 * hidden)  # + input and post-attention RMSNorm
    return {"total": fixed + total_mlp, "active": fixed + active_mlp, "experts": e, "top_k": k, "shared": s}
