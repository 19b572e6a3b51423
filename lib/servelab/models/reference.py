"""The model's own answers: greedy decoding in transformers on the CPU in float32, the reference an
engine's answers are held against (does this engine, on this machine, answer as the model does?).
Computed once per model, prompt list and length, and kept beside the model's manifest
(`reference_answers.json`); a model built from pinned bytes (the GGUF preset) also ships its
answers to the default study's prompts in `data/references/<model directory name>.json`
(made with `servelab model reference PRESET --ship`), so a fresh clone does not spend half a minute
making them again. Not for serving (engines) nor for comparing answers (`analysis.quality`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REFERENCE_JSON = "reference_answers.json"
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "references"


def _shipped(model_dir: Path) -> dict[str, Any]:
    """The answers shipped for this model ({} when none), by its directory's name (the preset and a hash
    of what it was built from: the same bytes on every machine)."""
    p = SHIPPED / f"{Path(model_dir).name}.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _key(prompts: Sequence[tuple[str, list[dict[str, Any]]]], max_tokens: int) -> str:
    blob = json.dumps([list(p) for p in prompts], sort_keys=True) + f"|{max_tokens}"
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cpu_name() -> str:
    """The CPU's model name and whether it has avx512_bf16 (vLLM's CPU build picks its bf16 kernels by it)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or "unknown CPU"
    bf16 = "avx512_bf16" in info.get("flags", "").split()
    return f"{name} ({'with' if bf16 else 'without'} avx512_bf16)"


def reference_answers(model_dir: Path, prompts: Sequence[tuple[str, list[dict[str, Any]]]], max_tokens: int,
                      *, shipped: bool = True) -> dict[str, Any]:
    """{"answers": {prompt id: {"output_text", "output_token_ids"}}, how and when they were made}: the
    model's greedy answers to `prompts` ((id, chat messages), in order), at most `max_tokens` each,
    from transformers in float32 on the CPU. Read from the model directory when made before for the
    same prompts and length, else computed (about 1.5 s a prompt of 48 tokens for SmolLM2-135M on a
    2-vCPU machine) and kept there."""
    model_dir = Path(model_dir)
    path, key = model_dir / REFERENCE_JSON, _key(prompts, max_tokens)
    cached = json.loads(path.read_text()) if path.exists() else {}
    if key in cached:
        return cached[key]
    ready = _shipped(model_dir) if shipped else {}
    if key in ready:
        return ready[key]
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers = {}
    for pid, messages in prompts:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        new = [int(t) for t in out[0, ids.shape[1]:]]  # with the end-of-sequence token, as vLLM reports it
        answers[pid] = {"output_text": tok.decode(new, skip_special_tokens=True), "output_token_ids": new}
    ref = {"answers": answers, "max_tokens": max_tokens, "dtype": "float32", "decoding": "greedy",
           "implementation": f"transformers {transformers.__version__}, torch {torch.__version__}",
           "computed_on": cpu_name(), "computed_at": time.strftime("%Y-%m-%d", time.gmtime()),
           "seconds": round(time.monotonic() - t0, 1)}
    cached[key] = ref
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cached, indent=1) + "\n")
    tmp.replace(path)
    return ref


def ship(model_dir: Path, ref: dict[str, Any]) -> Path:
    """Copy a model directory's reference answers into data/references (a maintainer's step: the
    answers then travel with servelab for that model's bytes)."""
    SHIPPED.mkdir(parents=True, exist_ok=True)
    out = SHIPPED / f"{Path(model_dir).name}.json"
    out.write_text((Path(model_dir) / REFERENCE_JSON).read_text())
    return out


__all__ = ["REFERENCE_JSON", "cpu_name", "reference_answers", "ship"]
