"""Model facts from the library: the architecture of an HF `config.json` instantiated by transformers
on the meta device (no weights, no download), its parameters counted by module kind (embeddings,
head, attention, linear attention or SSM mixers, dense MLP, routed experts, shared experts,
router, norms), the experts per layer, the experts a token takes (top-k) and the shared experts
read from the module tree, and the KV cache's per-layer layout (kind of each layer, KV heads and
head size, or MLA's latent) from the module tree and the config. An architecture transformers
cannot build is one `ArchitectureError` naming it and what is missing; a config that declares
experts whose module tree shows none is refused too (never read as a dense model).

`models.facts` turns this into the facts a run records; not for the KV-cache accounting of an
engine (`facts.kv_bytes_per_token`) nor for building directories (`models.build`).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from ..errors import UserError
from ..extras import require

#: parameter kinds, in the order the docs table shows them
KINDS = ("embedding", "lm_head", "attention", "linear_attention", "dense_mlp", "routed_experts", "shared_experts",
         "router", "norms_other")

#: config keys that say a model routes tokens to experts (any positive value), and the ones that say how many
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token", "moe_k", "top_k")

_ATTN_NAMES = {"self_attn", "attention", "attn", "self_attention"}
_MIXER_NAMES = {"linear_attn", "mamba", "mixer", "ssm", "short_conv", "conv", "recurrent", "temporal_block"}
_MLP_NAMES = {"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mixer_mlp"}
_MIXER_CLASS_HINTS = ("mamba", "deltanet", "linearattention", "ssm", "gla", "retnet", "rwkv", "shortconv")


class ArchitectureError(UserError, ValueError):
    """A config.json whose architecture servelab cannot read from the library: an unknown or
    custom-code model_type, a config transformers refuses, or a module tree that contradicts the config."""


def _first(cfg: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = getattr(cfg, k, None) if not isinstance(cfg, Mapping) else cfg.get(k)
        if v not in (None, 0, [], False):
            return v
    return None


def library_version() -> str:
    return str(require("transformers").__version__)


def build_config(cfg: Mapping[str, Any]) -> Any:
    """The transformers config object of a config.json mapping (keys starting with '_' are ignored)."""
    transformers = require("transformers")
    fields = {k: v for k, v in cfg.items() if not str(k).startswith("_")}
    model_type = fields.pop("model_type", None)
    name = (fields.get("architectures") or [model_type or "?"])[0]
    if not model_type:
        raise ArchitectureError(f"config.json of {name} has no model_type: servelab cannot tell its architecture")
    if fields.get("auto_map"):
        raise ArchitectureError(f"model_type {model_type!r} ({name}) needs its own modelling code (auto_map); "
                                "servelab does not run a model's remote code to count its parameters")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ArchitectureError(f"model_type {model_type!r} ({name}) is unknown to transformers "
                                f"{transformers.__version__}: servelab reads model facts from the library; "
                                "a newer transformers may know it")
    try:
        return transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ArchitectureError(f"model_type {model_type!r} ({name}): transformers {transformers.__version__} "
                                f"refuses its config: {str(e).splitlines()[0][:300]}") from None


def build_meta_model(cfg: Mapping[str, Any]) -> tuple[Any, Any]:
    """(config object, the causal LM instantiated on the meta device): shapes only, no memory."""
    torch = require("torch")
    transformers = require("transformers")
    config = build_config(cfg)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ArchitectureError(f"model_type {config.model_type!r} is not a causal language model transformers "
                                f"{transformers.__version__} can build (no AutoModelForCausalLM class)")
    tlog = transformers.utils.logging
    before = tlog.get_verbosity()
    tlog.set_verbosity_error()  # e.g. "the fast path is not available": kernels do not matter on the meta device
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 -- any failure of the library to build it is the user's answer
        raise ArchitectureError(f"model_type {config.model_type!r}: transformers {transformers.__version__} could "
                                f"not build it from its config ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
                                ) from None
    finally:
        tlog.set_verbosity(before)
    return config, model


def _decoder_layers(model: Any, n_layers: int) -> list[Any]:
    torch = require("torch")
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers and name.split(".")[-1] in (
                "layers", "h", "blocks", "layer", "decoder_layers"):
            return list(mod)
    raise ArchitectureError(f"{type(model).__name__}: no list of {n_layers} decoder layers in its module tree")


def _numel(mod: Any) -> int:
    return sum(p.numel() for p in mod.parameters())


def _role(name: str, child: Any) -> str:
    """What one child of a decoder layer is: moe, attention, linear_attention, dense_mlp or norms_other."""
    cls = type(child).__name__.lower()
    subs = {n.split(".")[-1] for n, _ in child.named_modules()}
    if "experts" in subs:
        return "moe"
    if name in _MIXER_NAMES or any(h in cls for h in _MIXER_CLASS_HINTS):
        return "linear_attention"
    if name in _ATTN_NAMES or subs & {"k_proj", "kv_a_proj_with_mqa", "qkv_proj", "query_key_value", "Wqkv", "c_attn"}:
        return "attention"
    if name in _MLP_NAMES or subs & {"gate_proj", "up_proj", "down_proj", "fc1", "fc2", "w1", "w2", "c_fc"}:
        return "dense_mlp"
    return "norms_other"


def _moe_block(block: Any, config: Any) -> dict[str, Any]:
    """Routed experts, shared experts and router of one MoE block, with E and top-k from the modules."""
    experts = next(m for n, m in block.named_modules() if n.split(".")[-1] == "experts")
    routed = _numel(experts)
    shared = sum(_numel(m) for n, m in block.named_children() if "shared" in n)
    n_exp = getattr(experts, "num_experts", None) or (len(experts) if hasattr(experts, "__len__") else None)
    n_exp = n_exp or _first(config, EXPERT_KEYS)
    top_k = None
    for m in [block, *(m for _, m in block.named_modules())]:
        top_k = top_k or getattr(m, "top_k", None)
    top_k = top_k or _first(config, TOPK_KEYS)
    if not n_exp or not top_k:
        raise ArchitectureError(f"{type(block).__name__}: its experts module does not say how many experts "
                                f"({n_exp}) or how many a token takes ({top_k}), nor does the config")
    n_shared = int(getattr(config, "n_shared_experts", None) or getattr(config, "num_shared_experts", None)
                   or (1 if shared else 0))
    return {"routed": routed, "shared": shared, "router": _numel(block) - routed - shared,
            "experts": int(n_exp), "top_k": int(top_k), "shared_experts": n_shared}


def _attention_kv(attn: Any, config: Any) -> dict[str, Any]:
    """KV elements one token keeps in one attention layer: K and V heads x head size, or MLA's latent
    plus rope key (kv_a_proj_with_mqa's width), from the module's projections."""
    mods = dict(attn.named_modules())
    if "kv_a_proj_with_mqa" in mods:
        return {"elems": int(mods["kv_a_proj_with_mqa"].out_features), "kv_heads": 1, "mla": True,
                "from": "kv_a_proj_with_mqa (latent + rope key)"}
    heads = int(getattr(config, "num_attention_heads"))
    head_dim = int(getattr(attn, "head_dim", None) or getattr(config, "head_dim", None)
                   or int(config.hidden_size) // heads)
    if "k_proj" in mods and "v_proj" in mods:
        k, v = int(mods["k_proj"].out_features), int(mods["v_proj"].out_features)
        return {"elems": k + v, "kv_heads": k // head_dim, "head_dim": head_dim, "mla": False, "from": "k_proj, v_proj"}
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return {"elems": 2 * kv_heads * head_dim, "kv_heads": kv_heads, "head_dim": head_dim, "mla": False,
            "from": "config (fused QKV projection): num_key_value_heads x head_dim"}


def _layer_types(config: Any, roles: list[set[str]]) -> list[str]:
    """full_attention, sliding_attention or linear_attention per layer: the config's layer_types
    where it has them, else the module tree (a layer without attention is linear) and the config's
    sliding window (every layer when it is set and not switched off)."""
    n = len(roles)
    types = getattr(config, "layer_types", None)
    if types and len(types) == n:
        out = []
        for t, r in zip(types, roles):
            if "attention" not in r:
                out.append("linear_attention")
            else:
                out.append("sliding_attention" if "sliding" in str(t) or "local" in str(t) or "chunked" in str(t)
                           else "full_attention")
        return out
    window = getattr(config, "sliding_window", None)
    sliding = bool(window) and getattr(config, "use_sliding_window", True) is not False
    return ["linear_attention" if "attention" not in r else ("sliding_attention" if sliding else "full_attention")
            for r in roles]


def _serving_dtype(config: Any) -> str:
    dt = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
    dt = dt.replace("torch.", "")
    # vLLM's dtype "auto" serves a float32 checkpoint in 16 bits (SGLang too)
    return "bfloat16" if dt == "float32" else dt


def _count(cfg: Mapping[str, Any]) -> dict[str, Any]:
    config, model = build_meta_model(cfg)
    n_layers = int(config.num_hidden_layers)
    layers = _decoder_layers(model, n_layers)
    kinds = dict.fromkeys(KINDS, 0)
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and emb is not None and head.weight is emb.weight
    kinds["embedding"] = _numel(emb) if emb is not None else 0
    kinds["lm_head"] = 0 if (head is None or tied) else _numel(head)
    roles, kv, moe = [], [], []
    inactive = 0.0
    for layer in layers:
        rs = set()
        for name, child in layer.named_children():
            role = _role(name, child)
            rs.add(role)
            if role == "moe":
                b = _moe_block(child, config)
                moe.append(b)
                kinds["routed_experts"] += b["routed"]
                kinds["shared_experts"] += b["shared"]
                kinds["router"] += b["router"]
                inactive += b["routed"] * (1 - b["top_k"] / b["experts"])
            else:
                kinds[role] += _numel(child)
                if role == "attention":
                    kv.append(_attention_kv(child, config))
        kinds["norms_other"] += sum(p.numel() for p in layer.parameters(recurse=False))
        roles.append(rs)
    total = int(model.num_parameters())
    kinds["norms_other"] += total - sum(kinds.values())  # final norm, rotary or scale parameters outside the layers
    declared = _first(config, EXPERT_KEYS)
    if declared and int(declared) > 1 and not moe:
        raise ArchitectureError(f"{type(model).__name__}: the config declares {declared} experts but no decoder layer "
                                "of the module tree has an experts module; servelab will not count it as a dense model")
    types = _layer_types(config, roles)
    out: dict[str, Any] = {
        "architecture": (cfg.get("architectures") or [type(model).__name__])[0],
        "model_class": type(model).__name__,
        "model_type": config.model_type,
        "param_count": total,
        "params_by_kind": kinds,
        "tie_word_embeddings": tied,
        "dtype": _serving_dtype(config),
        "num_layers": n_layers,
        "layer_types": types,
        "kv_per_layer": kv,
        "source": f"transformers {library_version()}: {type(model).__name__} built on the meta device from config.json",
    }
    if moe:
        out.update(num_moe_layers=len(moe), num_experts=moe[0]["experts"], num_active_experts=moe[0]["top_k"],
                   num_shared_experts=moe[0]["shared_experts"], active_param_count=int(round(total - inactive)),
                   routed_params_per_expert=kinds["routed_experts"] / sum(b["experts"] for b in moe))
    return out


@lru_cache(maxsize=256)
def _cached(key: str) -> dict[str, Any]:
    return _count(json.loads(key))


def library_facts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter counts by kind, experts, top-k, layer kinds and per-layer KV of one config.json,
    from the transformers model built on the meta device (cached per config)."""
    return copy.deepcopy(_cached(json.dumps(dict(cfg), sort_keys=True, default=str)))


__all__ = ["ArchitectureError", "EXPERT_KEYS", "KINDS", "TOPK_KEYS", "build_config", "build_meta_model",
           "library_facts", "library_version"]
