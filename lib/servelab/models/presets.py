"""Model presets servelab builds offline: HF configs shaped like real models (Llama-3.1-8B,
Qwen3-30B-A3B, DeepSeek-V2-Lite, Mixtral-8x7B, Qwen1.5-MoE-A2.7B, OLMoE-1B-7B, Gemma-2-27B,
ERNIE-4.5-21B-A3B, Granite-3.1-3B-A800M, Qwen3-8B, a tiny CPU Llama),
the Llama-3-style chat template and the special tokens. Data only; `models.build` writes directories from it."""

from __future__ import annotations

from typing import Any

from .gguf import GGUF_PRESETS

# Bump when anything about how a directory is produced changes (tokenizer
# training, files written, template); it is part of the directory hash.
RECIPE_VERSION = "modelmake-1"

# Stdlib text used for tokenizer training: the first this-many bytes of the
# sorted file list (about 1.5 s to train a 4096 vocab on one core).
CORPUS_BUDGET_BYTES = 4 * 1024 * 1024

VOCAB_MULTIPLE = 128  # config vocab_size = tokenizer size rounded up to this

BOS_TOKEN = "<|begin_of_text|>"

EOS_TEXT_TOKEN = "<|end_of_text|>"

START_HEADER_TOKEN = "<|start_header_id|>"

END_HEADER_TOKEN = "<|end_header_id|>"

EOT_TOKEN = "<|eot_id|>"

PAD_TOKEN = "<|pad|>"

# Order fixes their ids: 0..5.
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS_TOKEN,
    EOS_TEXT_TOKEN,
    START_HEADER_TOKEN,
    END_HEADER_TOKEN,
    EOT_TOKEN,
    PAD_TOKEN,
)

# Llama-3 pre-tokenization regex (splits words, numbers of <= 3 digits,
# punctuation runs, newlines, whitespace) applied before byte-level mapping.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama-3-like: BOS once, then header/content/eot per message. Content may be
# a string, None, or a list of OpenAI-style parts (text parts are joined).
# `enable_thinking` is accepted; when true, "<think>\n" opens the assistant turn.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}"
    "{%- set content = message['content'] %}"
    "{%- elif message['content'] is none %}"
    "{%- set content = '' %}"
    "{%- else %}"
    "{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + content | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

_LLAMA_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "initializer_range": 0.02,
    "use_cache": True,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# HF config.json fields per preset. `vocab_size` here is the *real* model's
# vocabulary (used for reference parameter counts); the written config.json
# gets the trained tokenizer's size rounded up to VOCAB_MULTIPLE instead, and
# bos/eos/pad ids are filled in from the tokenizer.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-tiny": {
        **_LLAMA_COMMON,
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "vocab_size": 4096,
    },
    "llama-3.1-8b": {
        **_LLAMA_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "vocab_size": 128256,
    },
    # Llama-2-7B's shape (meta-llama/Llama-2-7b-hf config.json): multi-head attention, 32 KV heads,
    # so its KV cache per token is four times Llama-3.1-8B's.
    "llama-2-7b": {
        **_LLAMA_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "vocab_size": 32000,
    },
    # Mixtral-8x7B's shape (mistralai/Mixtral-8x7B-v0.1 config.json): 8 experts of which 2 active
    # in every layer, grouped-query attention; 46.7 B parameters, 93 GB in bf16.
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "router_aux_loss_coef": 0.02,
        "output_router_logits": False,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "use_cache": True,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 48,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "use_cache": True,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "routed_scaling_factor": 1.0,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "scoring_func": "softmax",
        "norm_topk_prob": False,
        "aux_loss_alpha": 0.001,
        "seq_aux": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        # As in the real checkpoint: 163840 = 40 x 4096 context needs YaRN.
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "use_cache": True,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 102400,
    },
    # Qwen1.5-MoE-A2.7B's shape (Qwen/Qwen1.5-MoE-A2.7B config.json): 60 routed experts of which 4 per
    # token plus one shared expert with its own sigmoid gate in every layer; 14.3 B parameters, 2.7 B
    # active. A family the performance model had never predicted (issue #43: read as dense before).
    "qwen1.5-moe-a2.7b": {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 1,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 21,
        "max_position_embeddings": 8192,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "use_cache": True,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    },
    # OLMoE-1B-7B's shape (allenai/OLMoE-1B-7B-0924 config.json): 64 experts of which 8 per token in all
    # 16 layers, multi-head attention with q/k norms over the whole width; 6.9 B parameters, 1.3 B active.
    "olmoe-1b-7b": {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.01,
        "attention_bias": False,
        "clip_qkv": None,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.02,
        "use_cache": True,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 50304,
    },
    # Qwen2.5-32B's dimensions (Qwen/Qwen2.5-32B config.json, as tests/fixtures keeps it: 64 layers, hidden 5120,
    # MLP 27648, 40 query and 8 KV heads of 128, rope theta 1e6) on the Llama architecture with attention bias
    # (Qwen2's QKV bias; Llama's adds an o_proj bias too, 0.3 M parameters): the same kernels in vLLM and SGLang,
    # and the offline tokenizer works as it does for every Llama preset (Qwen2's tokenizer class adds a token).
    # 32.8 B parameters, 65.5 GB in bf16: big enough that TP=2 matters.
    "qwen2.5-32b": {
        **_LLAMA_COMMON,
        "attention_bias": True,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "vocab_size": 152064,
    },
    # Gemma-2-27B's shape (google/gemma-2-27b config.json): 46 layers alternating sliding-window (4,096) and
    # full attention, 32 query and 16 KV heads of 128, a 36,864-wide GeLU MLP, tied embeddings, logit
    # soft-capping; 27.2 B parameters with its own 256,000-token vocabulary (26.3 B with the preset's 32,000).
    # A dense family the performance model had never predicted (issue #59, on an H100).
    "gemma-2-27b": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "head_dim": 128,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 4608,
        "intermediate_size": 36864,
        "max_position_embeddings": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 46,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 144,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 256000,
    },
    # ERNIE-4.5-21B-A3B's shape (baidu/ERNIE-4.5-21B-A3B-PT config.json): 28 layers, the first dense (12,288
    # wide), 27 MoE layers of 64 experts (1,536 wide) of which 6 per token plus 2 shared experts, a router with
    # a per-expert score-correction bias (vLLM: e_score_correction_bias), 20 query and 4 KV heads of 128, tied
    # embeddings; 21.8 B parameters, 3.35 B active. Under dummy weights the bias ranks the experts alone, so
    # every token takes the same 6 (engines.vllm.dummy_router_ties).
    "ernie-4.5-21b-a3b": {
        "architectures": ["Ernie4_5_MoeForCausalLM"],
        "model_type": "ernie4_5_moe",
        "hidden_act": "silu",
        "hidden_size": 2560,
        "intermediate_size": 12288,
        "max_position_embeddings": 131072,
        "num_attention_heads": 20,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 28,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "use_bias": False,
        "tie_word_embeddings": True,
        "moe_num_experts": 64,
        "moe_num_shared_experts": 2,
        "moe_layer_start_index": 1,
        "moe_layer_end_index": 27,
        "moe_layer_interval": 1,
        "moe_intermediate_size": 1536,
        "moe_k": 6,
        "moe_capacity": [64, 64, 64],
        "moe_gate": "topk",
        "moe_use_aux_free": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 103424,
    },
    # Granite-3.1-3B-A800M's shape (ibm-granite/granite-3.1-3b-a800m-instruct config.json): 32 layers of 40
    # experts (512 wide) of which 8 per token, 24 query and 8 KV heads of 64, Granite's multipliers, tied
    # embeddings; 3.3 B parameters, 0.88 B active. A MoE family the model had never predicted (issue #59).
    "granite-3.1-3b-a800m": {
        "architectures": ["GraniteMoeForCausalLM"],
        "model_type": "granitemoe",
        "attention_bias": False,
        "attention_multiplier": 0.015625,
        "embedding_multiplier": 12.0,
        "hidden_act": "silu",
        "hidden_size": 1536,
        "intermediate_size": 512,
        "logits_scaling": 6.0,
        "max_position_embeddings": 131072,
        "num_attention_heads": 24,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 40,
        "residual_multiplier": 0.22,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0,
        "router_aux_loss_coef": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 49155,
    },
    # Qwen3-8B's shape (Qwen/Qwen3-8B config.json): 36 layers, 32 query and 8 KV heads of 128 with q/k norms,
    # a 12,288-wide MLP; 8.2 B parameters. A dense family the model had never predicted on a GPU (issue #59).
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    },
    # Moonlight-16B-A3B's shape (moonshotai/Moonlight-16B-A3B config.json): DeepSeek-V3's architecture at
    # DeepSeek-V2-Lite's size: 27 layers of latent attention (KV rank 512), the first dense, then 64 routed
    # experts of which 6 and 2 shared; its router scores with a sigmoid and picks through a per-expert bias
    # (noaux_tc), which ties under dummy weights. A family the model had never predicted (issue #59).
    "moonlight-16b-a3b": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 11264, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
        "num_experts_per_tok": 6, "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": True,
        "scoring_func": "sigmoid", "aux_loss_alpha": 0.001, "seq_aux": True, "attention_bias": False,
        "attention_dropout": 0.0, "max_position_embeddings": 8192, "rope_theta": 50000.0, "rms_norm_eps": 1e-5,
        "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 163840,
    },
    # gpt-oss-20b's shape (openai/gpt-oss-20b config.json) in bf16 (the published checkpoint's experts are
    # MXFP4): 24 layers alternating 128-token sliding-window and full attention with sinks, 64 query and 8 KV
    # heads of 64, 32 experts (2,880 wide, with biases) of which 4 per token; 20.9 B parameters, 3.6 B active.
    # A family the model had never predicted (issue #59). For `servelab predict`: vLLM serves gpt-oss's chat in its
    # Harmony format, which needs the model's own special tokens, so a server of this preset's directory (a trained
    # tokenizer) answers every chat request with HTTP 500 (reports/h100-eager-holdout); the completions API serves it
    # (reports/h100-mla-holdout).
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
        "num_local_experts": 32, "output_router_logits": False, "rms_norm_eps": 1e-5,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                         "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True, "torch_dtype": "bfloat16",
        "vocab_size": 201088,
    },
    # GLM-4.7-Flash's shape (zai-org/GLM-4.7-Flash config.json, transformers' Glm4MoeLiteConfig defaults): 47 layers
    # of latent attention (query rank 768, KV rank 512, 20 heads of 192 + 64 rope / 256 value), the first dense, then
    # 64 routed experts of which 4 and one shared; a sigmoid router that picks through a per-expert bias, so it ties
    # under dummy weights; 31 B parameters. A latent-attention family the model had never predicted (issue #59).
    "glm-4.7-flash": {
        "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
        "num_attention_heads": 20, "num_key_value_heads": 20, "n_shared_experts": 1, "n_routed_experts": 64,
        "num_experts_per_tok": 4, "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
        "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "norm_topk_prob": True, "attention_bias": False, "attention_dropout": 0.0,
        "max_position_embeddings": 202752, "rope_theta": 1000000.0, "rope_interleave": True, "rms_norm_eps": 1e-5,
        "initializer_range": 0.02, "use_cache": True, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 154880,
    },
    # Phi-4's shape (microsoft/phi-4 config.json): 40 dense layers, 40 query and 10 KV heads of 128 with a fused
    # QKV projection, a 17,920-wide MLP; 14.7 B parameters. A dense family the model had never predicted (issue #59).
    "phi-4": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_bias": False, "attention_dropout": 0.0,
        "embd_pdrop": 0.0, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 17920,
        "max_position_embeddings": 16384, "num_attention_heads": 40, "num_hidden_layers": 40,
        "num_key_value_heads": 10, "original_max_position_embeddings": 16384, "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 250000, "sliding_window": None,
        "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True, "torch_dtype": "bfloat16",
        "vocab_size": 100352,
    },
    # Mistral-NeMo-12B's shape (mistralai/Mistral-Nemo-Base-2407 config.json): 40 dense layers, 32 query and 8 KV
    # heads of 128 (narrower than 5,120 / 32), a 14,336-wide MLP; 12.2 B parameters. A dense family never predicted.
    "mistral-nemo-12b": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "attention_dropout": 0.0, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 14336, "max_position_embeddings": 1024000,
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0, "sliding_window": None, "initializer_range": 0.02, "tie_word_embeddings": False,
        "use_cache": True, "torch_dtype": "bfloat16", "vocab_size": 131072,
    },
}

# Trained tokenizer vocabulary per preset (special tokens included). Large
# presets share one 32000 tokenizer: big enough to look like a real vocab,
# small enough to train in a few seconds.
PRESET_TOKENIZER_VOCAB_SIZE: dict[str, int] = {
    "cpu-tiny": 4096,
    "llama-3.1-8b": 32000,
    "llama-2-7b": 32000,
    "mixtral-8x7b": 32000,
    "qwen3-30b-a3b": 32000,
    "deepseek-v2-lite": 32000,
    "qwen1.5-moe-a2.7b": 32000,
    "olmoe-1b-7b": 32000,
    "qwen2.5-32b": 32000,
    "gemma-2-27b": 32000,
    "ernie-4.5-21b-a3b": 32000,
    "granite-3.1-3b-a800m": 32000,
    "qwen3-8b": 32000,
    "moonlight-16b-a3b": 32000,
    "gpt-oss-20b": 32000,
    "phi-4": 32000,
    "mistral-nemo-12b": 32000,
    "glm-4.7-flash": 32000,
}

# Calibration models (`servelab calibrate-hw`, analysis.perfmodel): one per layer kind, width and
# depth, `calib-<kind>-w<width>-l<layers>`. Their weights are small, so an engine's time per decode
# step on them is its fixed cost per layer and per step; a second width on the CPU engine adds the
# bytes that separate its bandwidth from those costs. Kinds: dense (grouped-query attention + an
# MLP, Llama), moe (grouped-query attention + routed experts, Mixtral), mla (multi-head latent
# attention + routed and shared experts, DeepSeek-V2), moe_shared (grouped-query attention + routed experts
# and a gated shared expert, Qwen2-MoE: the shared expert's kernels are launched on top of the routed ones).
# None is the shape of a studied model.
CALIB_KINDS = ("dense", "moe", "mla", "moe_shared")
CALIB_WIDTHS = (256, 1024)
CALIB_LAYERS = (2, 4, 8, 16, 32, 64)  # the CPU calibration uses 2-8; the GPU adds 16-64 to leave its step floor


def calib_preset(kind: str, width: int, layers: int) -> dict[str, Any]:
    """The HF config of one calibration model."""
    heads = max(1, width // 64)
    if kind == "dense":
        return {**_LLAMA_COMMON, "hidden_size": width, "intermediate_size": 3 * width, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2), "head_dim": 64,
                "max_position_embeddings": 4096, "rope_theta": 10000.0, "vocab_size": 4096}
    if kind == "moe":
        return {**_LLAMA_COMMON, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": width, "intermediate_size": width, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2), "head_dim": 64,
                "num_local_experts": 16, "num_experts_per_tok": 4, "router_aux_loss_coef": 0.0,
                "max_position_embeddings": 4096, "rope_theta": 10000.0, "vocab_size": 4096}
    if kind == "mla":
        base = dict(PRESETS["deepseek-v2-lite"])
        base.pop("rope_scaling")
        return {**base, "hidden_size": width, "intermediate_size": 3 * width, "num_hidden_layers": layers,
                "moe_intermediate_size": width, "n_routed_experts": 16, "n_shared_experts": 1,
                "num_experts_per_tok": 4, "first_k_dense_replace": 0, "max_position_embeddings": 4096,
                "vocab_size": 4096}
    if kind == "moe_shared":
        base = dict(PRESETS["qwen1.5-moe-a2.7b"])
        return {**base, "hidden_size": width, "intermediate_size": width, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2), "num_experts": 16,
                "num_experts_per_tok": 4, "moe_intermediate_size": width, "shared_expert_intermediate_size": width,
                "max_window_layers": layers, "max_position_embeddings": 4096, "vocab_size": 4096}
    raise KeyError(f"unknown calibration kind {kind!r}; known: {CALIB_KINDS}")


def calib_name(kind: str, width: int, layers: int) -> str:
    return f"calib-{kind}-w{width}-l{layers}"


for _k in CALIB_KINDS:
    for _w in CALIB_WIDTHS:
        for _n in CALIB_LAYERS:
            PRESETS[calib_name(_k, _w, _n)] = calib_preset(_k, _w, _n)
            PRESET_TOKENIZER_VOCAB_SIZE[calib_name(_k, _w, _n)] = 4096


def list_presets() -> list[str]:
    """Names accepted by `make_model`, CPU default first, then the real-weights presets
    (`models.gguf`), then the calibration models."""
    calib = [n for n in PRESETS if n.startswith("calib-")]
    return [n for n in PRESETS if n not in calib] + list(GGUF_PRESETS) + calib
