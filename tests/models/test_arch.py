"""Model facts from the library (models.arch, models.facts, issue #43): for public architectures whose
configs are written from their published config.json (tests/fixtures/architectures/, each naming its
source), servelab's total and active parameter counts equal the library's own count of the model
transformers builds on the meta device (counted here independently: every parameter, and the routed
experts' tensors scaled by top-k / experts), its KV bytes per token equal the engine's formula (written
out per architecture below), the docs table (docs/predictions.md) says the same, and the hand formulas
servelab used before agree where they exist. An architecture the library cannot build, or a config that
declares experts the module tree does not have, is refused in one line, never read as dense."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hand_facts import hand_counts
from paths import ROOT

from servelab.models import arch
from servelab.models.facts import facts_from_config, kv_bytes_per_token, kv_read_bytes_per_token

FIXTURES = ROOT / "tests" / "fixtures" / "architectures"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))
DOC = ROOT / "docs" / "predictions.md"

# The engine's KV bytes per token (bf16), as vLLM 0.26's hybrid KV-cache manager counts its pool: layers x 2
# (K, V) x KV heads x head size x 2 bytes; MLA: layers x (kv_lora_rank + rope dim) x 2; layers of two kinds:
# group size x groups layer slots (vllm/v1/core/kv_cache_utils.py, _get_kv_cache_groups_uniform_page_size).
ENGINE_KV = {
    "deepseek-v2-lite": 27 * (512 + 64) * 2,
    "ernie-4.5-21b-a3b": 28 * 2 * 4 * 128 * 2,
    "gemma-2-27b": (23 + 23) * 2 * 16 * 128 * 2,  # 23 sliding + 23 full: two groups of 23
    "gemma-2-9b": (21 + 21) * 2 * 8 * 256 * 2,  # 21 sliding + 21 full: two groups of 21
    "gpt-oss-20b": (12 + 12) * 2 * 8 * 64 * 2,  # 12 sliding + 12 full: two groups of 12
    "granite-3.1-3b-a800m": 32 * 2 * 8 * 64 * 2,
    "jamba-v0.1": 4 * 8 * 2 * 8 * 128 * 2,  # 4 attention + 28 Mamba layers: groups of 4, 1 + 7 groups
    "llama-3.1-8b": 32 * 2 * 8 * 128 * 2,
    "mistral-7b-v0.1": 32 * 2 * 8 * 128 * 2,  # every layer slides (4096): one kind, every layer counted
    "mixtral-8x7b": 32 * 2 * 8 * 128 * 2,
    "olmoe-1b-7b-0924": 16 * 2 * 16 * 128 * 2,
    "phi-3.5-moe": 32 * 2 * 8 * 128 * 2,
    "qwen1.5-moe-a2.7b": 24 * 2 * 16 * 128 * 2,
    "qwen2.5-32b": 64 * 2 * 8 * 128 * 2,
    "qwen3-30b-a3b": 48 * 2 * 4 * 128 * 2,
    "qwen3-8b": 36 * 2 * 8 * 128 * 2,
    "qwen3-next-80b-a3b": 12 * 4 * 2 * 2 * 256 * 2,  # 12 full + 36 linear: groups of 12, 1 + 3 groups
}
# Published totals (model cards, billions) as a sanity check of the fixtures themselves.
PUBLISHED_B = {"deepseek-v2-lite": 15.7, "ernie-4.5-21b-a3b": 21.8, "gemma-2-27b": 27.2, "gemma-2-9b": 9.24, "gpt-oss-20b": 20.9, "granite-3.1-3b-a800m": 3.3,
               "jamba-v0.1": 52, "llama-3.1-8b": 8.03, "mistral-7b-v0.1": 7.24, "mixtral-8x7b": 46.7,
               "olmoe-1b-7b-0924": 6.9, "phi-3.5-moe": 41.9, "qwen1.5-moe-a2.7b": 14.3, "qwen2.5-32b": 32.5,
               "qwen3-30b-a3b": 30.5, "qwen3-8b": 8.2, "qwen3-next-80b-a3b": 80}
MOE_KEYS = {"num_experts": "num_experts_per_tok", "num_local_experts": "num_experts_per_tok",
            "n_routed_experts": "num_experts_per_tok", "moe_num_experts": "moe_k"}


def _config(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def library_count(cfg: dict) -> tuple[int, int]:
    """(total, active) of the model transformers builds on the meta device, counted here: every
    parameter once, and each routed-experts tensor scaled by top-k / experts from the config."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    config = AutoConfig.for_model(cfg["model_type"], **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    key = next((k for k in MOE_KEYS if cfg.get(k)), None)
    if not key:
        return total, total
    e, k = cfg[key], cfg[MOE_KEYS[key]]
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total, round(total - routed * (1 - k / e))


def test_the_fixtures_cover_what_the_issue_asks():
    facts = {n: facts_from_config(_config(n)) for n in NAMES}
    moe_families = {f["model_type"] for f in facts.values() if f.get("num_experts")}
    assert len(NAMES) >= 12 and len(moe_families) >= 6, moe_families
    assert any(f["attention"] == "mla" for f in facts.values())
    assert any("sliding_attention" in f["kv_layers"] for f in facts.values())
    assert any("linear_attention" in f["kv_layers"] for f in facts.values())
    for n in NAMES:
        assert _config(n)["_source"].split()[0].count("/") == 1, n  # an HF model id: org/name


@pytest.mark.parametrize("name", NAMES)
def test_servelab_counts_what_the_library_builds(name):
    cfg = _config(name)
    f = facts_from_config(cfg)
    total, active = library_count(cfg)
    assert f["param_count"] == total
    assert f.get("active_param_count", f["param_count"]) == pytest.approx(active, abs=1)
    assert sum(f["params_by_kind"].values()) == total
    assert f["param_count"] / 1e9 == pytest.approx(PUBLISHED_B[name], rel=0.03)
    assert f["kv_cache_bytes_per_token"] == ENGINE_KV[name]
    if f.get("num_experts"):
        assert f["params_by_kind"]["routed_experts"] > 0 and f["params_by_kind"]["router"] > 0
        assert f["num_active_experts"] == next(cfg[v] for k, v in MOE_KEYS.items() if cfg.get(k))


def test_the_hand_formulas_agree_where_they_exist():
    for name in ("llama-3.1-8b", "mistral-7b-v0.1", "qwen3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"):
        cfg = {k: v for k, v in _config(name).items() if not k.startswith("_")}
        f, h = facts_from_config(cfg), hand_counts(cfg)
        assert (f["param_count"], f.get("active_param_count", f["param_count"])) == (h["total"], h["active"]), name
        assert (f.get("num_experts", 0), f.get("num_active_experts", 0), f.get("num_shared_experts", 0)) == (
            h["experts"], h["top_k"], h["shared"]), name


def test_moe_facts_read_from_the_module_tree():
    q = facts_from_config(_config("qwen1.5-moe-a2.7b"))
    assert (q["num_experts"], q["num_active_experts"], q["num_shared_experts"], q["num_moe_layers"]) == (60, 4, 1, 24)
    assert q["weight_bytes"] / 2**30 == pytest.approx(26.67, abs=0.01)  # vLLM loaded 26.67 GiB (the issue)
    assert q["params_by_kind"]["shared_experts"] == 24 * (3 * 2048 * 5632 + 2048)  # with its own gate
    ds = facts_from_config(_config("deepseek-v2-lite"))
    assert (ds["num_moe_layers"], ds["num_shared_experts"], ds["attention"]) == (26, 2, "mla")
    assert ds["params_by_kind"]["dense_mlp"] == 3 * 2048 * 10944  # the first layer is dense
    gpt = facts_from_config(_config("gpt-oss-20b"))
    assert gpt["quantization"] == "mxfp4" and gpt["weight_bytes"] / 2**30 == pytest.approx(12.8, abs=0.1)


def test_kv_layout_of_sliding_and_hybrid_models():
    g = facts_from_config(_config("gemma-2-9b"))
    assert g["kv_layers"] == {"sliding_attention": 21, "full_attention": 21} and g["sliding_window"] == 4096
    per_layer = 2 * 8 * 256 * 2
    assert kv_read_bytes_per_token(g, 8192) == pytest.approx(per_layer * (21 + 21 * 4096 / 8192))
    assert kv_read_bytes_per_token(g, 1024) == pytest.approx(42 * per_layer)
    nxt = facts_from_config(_config("qwen3-next-80b-a3b"))
    assert nxt["kv_layers"] == {"linear_attention": 36, "full_attention": 12} and nxt["kv_full_layers"] == 12
    assert kv_read_bytes_per_token(nxt, 1000) == pytest.approx(12 * 2 * 2 * 256 * 2)
    assert kv_bytes_per_token(nxt, "fp8") == ENGINE_KV["qwen3-next-80b-a3b"] // 2
    assert kv_bytes_per_token(_config("qwen2.5-32b"), tensor_parallel_size=4) == 64 * 2 * 2 * 128 * 2  # a raw config


def test_an_unknown_architecture_is_refused_in_one_line():
    with pytest.raises(arch.ArchitectureError, match="model_type 'nonsense' .* unknown to transformers"):
        facts_from_config({"model_type": "nonsense", "hidden_size": 8})
    with pytest.raises(arch.ArchitectureError, match="remote code"):
        facts_from_config({**_config("llama-3.1-8b"), "auto_map": {"AutoModelForCausalLM": "x.Y"}})
    with pytest.raises(arch.ArchitectureError, match="no model_type"):
        facts_from_config({"hidden_size": 8})


def test_declared_experts_without_an_experts_module_are_never_counted_as_dense():
    cfg = {k: v for k, v in _config("llama-3.1-8b").items() if not k.startswith("_")}
    with pytest.raises(arch.ArchitectureError, match="declares 8 experts but no decoder layer"):
        facts_from_config({**cfg, "num_hidden_layers": 2, "num_local_experts": 8})


def test_predict_model_exits_2_on_an_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nonsense", "architectures": ["NonsenseLM"]}))
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "predict", "--model", str(tmp_path), "--gpu",
                        "NVIDIA H200"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "model_type 'nonsense'" in r.stderr


def _doc_rows() -> dict[str, list[str]]:
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- architectures -->")[1].split("<!-- /architectures -->")[0]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return rows


def _int(s: str) -> int:
    return int(re.sub(r"[^\d]", "", s))


def test_the_docs_table_is_what_the_library_says():
    rows = _doc_rows()
    assert sorted(rows) == NAMES
    for name in NAMES:
        cfg = _config(name)
        f = facts_from_config(cfg)
        total, active = library_count(cfg)
        cells = rows[name]
        assert (_int(cells[3]), _int(cells[4])) == (total, f["param_count"]), name
        assert (_int(cells[5]), _int(cells[6])) == (active, f.get("active_param_count", f["param_count"])), name
        assert (_int(cells[8]), _int(cells[9])) == (ENGINE_KV[name], f["kv_cache_bytes_per_token"]), name
