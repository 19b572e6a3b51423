"""Offline model directories for benchmarking LLM servers with random weights.

`make_model(preset)` writes a directory that vLLM can serve with
``--load-format dummy``: an HF ``config.json`` shaped like a real model
(Llama-3.1-8B, Qwen3-30B-A3B, DeepSeek-V2-Lite, or a tiny CPU Llama), a
``generation_config.json``, and a byte-level BPE tokenizer with a Llama-3-style
chat template, trained in a few seconds on the Python standard library's own
``.py`` sources so that nothing is downloaded. `model_facts` reads the shapes
back (parameter counts, KV-cache bytes per token) for reports.

It is *for* measuring serving speed (scheduling, batching, memory, kernels);
it is *not* a model: weights are random, so the text is noise, and the
tokenizer is not the real model's tokenizer (different vocabulary size and
token boundaries), so token counts per character and lm_head cost differ from
the real model unless the caller accounts for it (see `PRESETS`'s reference
``vocab_size`` and `facts_from_config(..., vocab_size=...)`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PRESETS",
    "PRESET_TOKENIZER_VOCAB_SIZE",
    "RECIPE_VERSION",
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "list_presets",
    "make_model",
    "model_facts",
    "facts_from_config",
    "default_cache_root",
    "train_tokenizer",
    "load_corpus",
    "Corpus",
]

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
_LLAMA3_SPLIT_PATTERN = (
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
}

# Trained tokenizer vocabulary per preset (special tokens included). Large
# presets share one 32000 tokenizer: big enough to look like a real vocab,
# small enough to train in a few seconds.
PRESET_TOKENIZER_VOCAB_SIZE: dict[str, int] = {
    "cpu-tiny": 4096,
    "llama-3.1-8b": 32000,
    "qwen3-30b-a3b": 32000,
    "deepseek-v2-lite": 32000,
}

_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
}

_MANIFEST_NAME = "servelab_model.json"  # written last; marks a finished build


def list_presets() -> list[str]:
    """Names accepted by `make_model`, CPU default first."""
    return list(PRESETS)


# --------------------------------------------------------------------------
# Corpus


@dataclass(frozen=True)
class Corpus:
    """Training text and where it came from."""

    texts: list[str]
    files: list[str]  # paths relative to stdlib_dir, in training order
    stdlib_dir: str
    size_bytes: int
    sha256: str


def _keep_stdlib_file(rel_parts: tuple[str, ...]) -> bool:
    skip_top = rel_parts[0] in ("site-packages", "dist-packages") or rel_parts[0].startswith(
        "config-"
    )
    skip_dir = any(p in ("test", "tests", "idle_test", "__pycache__") for p in rel_parts[:-1])
    # _sysconfigdata_* holds build paths of this interpreter: machine-specific.
    skip_name = rel_parts[-1].startswith("_sysconfigdata")
    return not (skip_top or skip_dir or skip_name)


def load_corpus(
    stdlib_dir: Path | None = None, budget_bytes: int = CORPUS_BUDGET_BYTES
) -> Corpus:
    """The first `budget_bytes` of UTF-8 stdlib ``.py`` sources, sorted by path.

    Deterministic for a given Python installation; a different Python version
    gives a different corpus, which `sha256` (part of the cache key) exposes.
    """
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    rel_paths: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinks
        rel_dir = Path(dirpath).relative_to(root).parts
        # Prune what _keep_stdlib_file would drop anyway (site-packages is big).
        dirnames[:] = sorted(d for d in dirnames if _keep_stdlib_file((*rel_dir, d, "x.py")))
        for name in filenames:
            if name.endswith(".py"):
                rel = Path(dirpath, name).relative_to(root)
                if _keep_stdlib_file(rel.parts):
                    rel_paths.append(rel.as_posix())
    rel_paths.sort()

    texts: list[str] = []
    used: list[str] = []
    digest = hashlib.sha256()
    total_bytes = 0
    for rel in rel_paths:
        if total_bytes >= budget_bytes:
            break
        data = (root / rel).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        data = data[: budget_bytes - total_bytes]
        text = data.decode("utf-8", errors="ignore")  # a cut may split a character
        texts.append(text)
        used.append(rel)
        total_bytes += len(data)
        digest.update(rel.encode() + b"\0" + data + b"\0")
    if total_bytes == 0:
        raise RuntimeError(f"no usable .py files under {root}")
    return Corpus(texts, used, str(root), total_bytes, digest.hexdigest())


# --------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(vocab_size: int, corpus: Corpus | None = None):
    """Train a byte-level BPE `tokenizers.Tokenizer` (specials at ids 0..5)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    corpus = corpus or load_corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(corpus.texts, trainer=trainer, length=len(corpus.texts))
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tok


def _save_tokenizer(tok, out_dir: Path, model_max_length_tokens: int) -> None:
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOT_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length_tokens,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(out_dir))
    # transformers 5 aliases PreTrainedTokenizerFast to TokenizersBackend and
    # writes that name; older loaders only know PreTrainedTokenizerFast. It may
    # also put the template only in chat_template.jinja: keep a copy inline.
    cfg_path = out_dir / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tcfg["bos_token"] = BOS_TOKEN
    tcfg["eos_token"] = EOT_TOKEN
    tcfg["pad_token"] = PAD_TOKEN
    tcfg["add_bos_token"] = True
    tcfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True) + "\n")
    # save_pretrained may write machine- or version-specific noise here; the
    # tokenizer is fully described by tokenizer.json + tokenizer_config.json.
    for extra in ("special_tokens_map.json",):
        p = out_dir / extra
        if p.exists():
            p.unlink()


# --------------------------------------------------------------------------
# Cache location and build


def _find_project_root(start: Path) -> Path | None:
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return None


def default_cache_root() -> Path:
    """Where model dirs go when `make_model` gets no `root`.

    ``$SERVELAB_CACHE/models`` if that variable is set, else
    ``<project>/.cache/servelab/models`` for the nearest directory at or above
    the cwd holding a pyproject.toml, else ``~/.cache/servelab/models``.
    """
    env = os.environ.get("SERVELAB_CACHE")
    if env:
        return Path(env).expanduser() / "models"
    project = _find_project_root(Path.cwd().resolve())
    if project is not None:
        return project / ".cache" / "servelab" / "models"
    return Path.home() / ".cache" / "servelab" / "models"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _cache_key(preset: str, corpus: Corpus) -> dict[str, Any]:
    return {
        "recipe_version": RECIPE_VERSION,
        "preset": preset,
        "config": PRESETS[preset],
        "tokenizer_vocab_size": PRESET_TOKENIZER_VOCAB_SIZE[preset],
        "corpus_budget_bytes": CORPUS_BUDGET_BYTES,
        "corpus_sha256": corpus.sha256,
        "chat_template": CHAT_TEMPLATE,
    }


def _short_hash(obj: Any, n_hex: int = 10) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n_hex]


def _is_finished(model_dir: Path) -> bool:
    return all(
        (model_dir / f).is_file()
        for f in (_MANIFEST_NAME, "config.json", "tokenizer.json", "tokenizer_config.json")
    )


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _build_into(out_dir: Path, preset: str, corpus: Corpus, key: dict[str, Any]) -> None:
    t0_s = time.perf_counter()
    tok = train_tokenizer(PRESET_TOKENIZER_VOCAB_SIZE[preset], corpus)
    train_s = time.perf_counter() - t0_s
    tokenizer_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}

    cfg = copy.deepcopy(PRESETS[preset])
    reference_vocab_size = cfg["vocab_size"]
    cfg["vocab_size"] = _round_up(tokenizer_size, VOCAB_MULTIPLE)
    cfg["bos_token_id"] = ids[BOS_TOKEN]
    cfg["eos_token_id"] = ids[EOT_TOKEN]
    cfg["pad_token_id"] = ids[PAD_TOKEN]

    _save_tokenizer(tok, out_dir, cfg["max_position_embeddings"])
    _write_json(out_dir / "config.json", cfg)
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": ids[BOS_TOKEN],
            # Chat turns end with <|eot_id|>; raw text with <|end_of_text|>.
            "eos_token_id": [ids[EOT_TOKEN], ids[EOS_TEXT_TOKEN]],
            "pad_token_id": ids[PAD_TOKEN],
        },
    )
    _write_json(
        out_dir / _MANIFEST_NAME,
        {
            "cache_key": key,
            "tokenizer_size": tokenizer_size,
            "config_vocab_size": cfg["vocab_size"],
            "reference_vocab_size": reference_vocab_size,
            "corpus": {
                "stdlib_dir": corpus.stdlib_dir,
                "python_version": sys.version.split()[0],
                "n_files": len(corpus.files),
                "first_file": corpus.files[0],
                "last_file": corpus.files[-1],
                "size_bytes": corpus.size_bytes,
                "sha256": corpus.sha256,
            },
            "tokenizer_train_s": round(train_s, 3),
        },
    )


def make_model(preset: str, root: Path | None = None, *, force: bool = False) -> Path:
    """Build (or reuse) ``<root>/<preset>-<hash>`` and return its path.

    The hash covers the preset's config fields, tokenizer vocab size, the
    recipe version, the chat template and the training corpus digest, so any
    change yields a new directory. The build happens in a temp dir inside
    `root` that is renamed into place only when complete; `force` rebuilds and
    replaces an existing directory.
    """
    if preset not in PRESETS:
        raise KeyError(f"unknown preset {preset!r}; choose from {list_presets()}")
    root = Path(root) if root is not None else default_cache_root()
    corpus = load_corpus()
    key = _cache_key(preset, corpus)
    final = root / f"{preset}-{_short_hash(key)}"
    if _is_finished(final) and not force:
        return final

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        _build_into(tmp, preset, corpus, key)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if final.exists():
            if not force and _is_finished(final):  # another process won the race
                shutil.rmtree(tmp)
                return final
            trash = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=root))
            os.rename(final, trash / "d")
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# --------------------------------------------------------------------------
# Facts


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
    dtype_bytes = _DTYPE_BYTES.get(dtype, 2)
    tied = bool(cfg.get("tie_word_embeddings", False))
    is_mla = "kv_lora_rank" in cfg

    embedding_params = vocab * hidden
    lm_head_params = 0 if tied else vocab * hidden
    final_norm_params = hidden
    layer_norm_params = 2 * hidden  # input + post-attention RMSNorm

    def dense_mlp(inter: int) -> int:
        return 3 * hidden * inter + (2 * inter + hidden if cfg.get("mlp_bias") else 0)

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

    # --- attention per layer, and KV cache per token
    if is_mla:
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
        # vLLM's MLA cache stores the compressed latent + rope key once per layer.
        kv_bytes_per_token = n_layers * (kv_lora + rope) * dtype_bytes
        facts.update(
            head_dim=qk_dim,
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=v_dim,
            kv_lora_rank=kv_lora,
            q_lora_rank=q_lora,
        )
    else:
        head_dim = int(cfg.get("head_dim") or hidden // n_heads)
        q_out, kv_out = n_heads * head_dim, n_kv_heads * head_dim
        attn_params = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
        if cfg.get("attention_bias"):
            attn_params += q_out + 2 * kv_out + (hidden if model_type == "llama" else 0)
        if model_type in ("qwen3", "qwen3_moe"):
            attn_params += 2 * head_dim  # q_norm, k_norm
        kv_bytes_per_token = 2 * n_layers * n_kv_heads * head_dim * dtype_bytes
        facts["head_dim"] = head_dim

    # --- MLP / experts per layer
    total_mlp = active_mlp = 0
    n_experts = n_active_experts = n_shared_experts = 0
    if model_type == "qwen3_moe":
        n_experts = int(cfg["num_experts"])
        n_active_experts = int(cfg["num_experts_per_tok"])
        expert = 3 * hidden * int(cfg["moe_intermediate_size"])
        sparse_step = int(cfg.get("decoder_sparse_step", 1))
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        for i in range(n_layers):
            if i not in mlp_only and n_experts > 0 and (i + 1) % sparse_step == 0:
                router = hidden * n_experts
                total_mlp += n_experts * expert + router
                active_mlp += n_active_experts * expert + router
            else:
                total_mlp += dense_mlp(int(cfg["intermediate_size"]))
                active_mlp += dense_mlp(int(cfg["intermediate_size"]))
    elif is_mla and cfg.get("n_routed_experts"):
        n_experts = int(cfg["n_routed_experts"])
        n_active_experts = int(cfg["num_experts_per_tok"])
        n_shared_experts = int(cfg.get("n_shared_experts") or 0)
        moe_inter = int(cfg["moe_intermediate_size"])
        expert = 3 * hidden * moe_inter
        shared = dense_mlp(moe_inter * n_shared_experts) if n_shared_experts else 0
        first_dense = int(cfg.get("first_k_dense_replace", 0))
        freq = int(cfg.get("moe_layer_freq", 1))
        for i in range(n_layers):
            if i >= first_dense and i % freq == 0:
                router = n_experts * hidden
                if cfg.get("topk_method") == "noaux_tc":
                    router += n_experts  # e_score_correction_bias
                total_mlp += n_experts * expert + shared + router
                active_mlp += n_active_experts * expert + shared + router
            else:
                total_mlp += dense_mlp(int(cfg["intermediate_size"]))
                active_mlp += dense_mlp(int(cfg["intermediate_size"]))
    else:
        total_mlp = active_mlp = n_layers * dense_mlp(int(cfg["intermediate_size"]))

    per_layer_fixed = n_layers * (attn_params + layer_norm_params)
    outside_layers = embedding_params + lm_head_params + final_norm_params
    param_count = outside_layers + per_layer_fixed + total_mlp
    facts.update(
        param_count=param_count,
        embedding_param_count=embedding_params,
        lm_head_param_count=lm_head_params,
        weight_bytes=param_count * dtype_bytes,
        kv_cache_bytes_per_token=kv_bytes_per_token,
    )
    if n_experts:
        facts.update(
            num_experts=n_experts,
            num_active_experts=n_active_experts,
            num_shared_experts=n_shared_experts,
            active_param_count=outside_layers + per_layer_fixed + active_mlp,
        )
    return facts


def model_facts(model_dir: Path, *, vocab_size: int | None = None) -> dict[str, Any]:
    """`facts_from_config` of ``model_dir/config.json`` (see there for `vocab_size`)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return facts_from_config(cfg, vocab_size=vocab_size)
