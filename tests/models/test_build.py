"""Tests for servelab.modelmake: offline random-weight model directories."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.models import build as mm
from servelab.models import facts as mm_facts
from servelab.models import presets as mm_presets

LIB_DIR = Path(mm.__file__).resolve().parents[2]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def chat_ids(tok, messages, **kwargs) -> list[int]:
    # transformers 5 returns a BatchEncoding by default, 4.x a list of ids.
    out = tok.apply_chat_template(messages, **kwargs)
    return list(out if isinstance(out, list) else out["input_ids"])


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def built(root) -> dict[str, Path]:
    return {p: mm.make_model(p, root) for p in mm.PRESETS}


@pytest.fixture(scope="module")
def tiny_tok(built):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built["cpu-tiny"])


def meta_model_param_counts(cfg: dict) -> tuple[int, object]:
    """Parameter count of the transformers model built on the meta device."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if k != "architectures"}
    config = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), model


# ---------------------------------------------------------------- presets


def test_list_presets():
    names = mm.list_presets()
    assert names[:19] == ["cpu-tiny", "llama-3.1-8b", "llama-2-7b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite",
                          "qwen1.5-moe-a2.7b", "olmoe-1b-7b", "qwen2.5-32b", "gemma-2-27b", "ernie-4.5-21b-a3b",
                          "granite-3.1-3b-a800m", "qwen3-8b", "moonlight-16b-a3b", "gpt-oss-20b", "glm-4.7-flash", "phi-4",
                          "mistral-nemo-12b", "smollm2-135m"]
    p = mm_presets
    calib = [p.calib_name(k, w, n) for k in p.CALIB_KINDS for w in p.CALIB_WIDTHS for n in p.CALIB_LAYERS]
    assert names[19:] == calib and len(calib) == 48
    assert set(mm.PRESET_TOKENIZER_VOCAB_SIZE) == set(mm.PRESETS)


def test_unknown_preset_raises(root):
    with pytest.raises(KeyError):
        mm.make_model("no-such-model", root)


@pytest.mark.parametrize("preset", list(mm.PRESETS))
def test_preset_builds(built, root, preset):
    from transformers import AutoTokenizer

    d = built[preset]
    assert d.parent == root
    assert re.fullmatch(rf"{re.escape(preset)}-[0-9a-f]{{10}}", d.name)
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "servelab_model.json",
    ):
        assert (d / name).is_file(), name
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "temp dirs left behind"

    cfg = json.loads((d / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) == mm.PRESET_TOKENIZER_VOCAB_SIZE[preset]
    assert cfg["vocab_size"] % 128 == 0
    assert len(tok) <= cfg["vocab_size"] < len(tok) + 128
    assert cfg["bos_token_id"] == tok.bos_token_id == tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert cfg["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids("<|eot_id|>")
    assert cfg["pad_token_id"] == tok.pad_token_id == tok.convert_tokens_to_ids("<|pad|>")
    for k, v in mm.PRESETS[preset].items():
        if k != "vocab_size":
            assert cfg[k] == v, k

    gen = json.loads((d / "generation_config.json").read_text())
    assert gen["bos_token_id"] == tok.bos_token_id
    assert gen["eos_token_id"] == [
        tok.convert_tokens_to_ids("<|eot_id|>"),
        tok.convert_tokens_to_ids("<|end_of_text|>"),
    ]

    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    assert tcfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tcfg["chat_template"] == mm.CHAT_TEMPLATE
    assert (tcfg["bos_token"], tcfg["eos_token"], tcfg["pad_token"]) == (
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|pad|>",
    )


def test_special_token_ids_fixed(tiny_tok):
    assert tiny_tok.convert_tokens_to_ids(list(mm.SPECIAL_TOKENS)) == list(range(6))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("preset", list(mm.PRESETS))
def test_autoconfig_loads_and_numbers_match(built, preset):
    from transformers import AutoConfig

    want = mm.PRESETS[preset]
    c = AutoConfig.from_pretrained(built[preset])
    assert c.model_type == want["model_type"]
    assert c.architectures == want["architectures"]
    assert c.hidden_size == want["hidden_size"]
    assert c.num_hidden_layers == want["num_hidden_layers"]
    assert c.num_attention_heads == want["num_attention_heads"]
    assert c.num_key_value_heads == want["num_key_value_heads"]
    assert c.intermediate_size == want["intermediate_size"]
    assert c.max_position_embeddings == want["max_position_embeddings"]
    assert str(c.dtype).removeprefix("torch.") == "bfloat16"
    assert c.tie_word_embeddings is want.get("tie_word_embeddings", False)
    # transformers 5 folds rope_theta/rope_scaling into rope_parameters.
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta}
    assert rope["rope_theta"] == want["rope_theta"]
    if "kv_lora_rank" in want:
        assert c.kv_lora_rank == 512
        assert c.q_lora_rank == want["q_lora_rank"]
        assert (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (
            want["qk_nope_head_dim"], want["qk_rope_head_dim"], want["v_head_dim"])
        assert (c.n_routed_experts, c.n_shared_experts, c.num_experts_per_tok) == (
            want["n_routed_experts"], want["n_shared_experts"], want["num_experts_per_tok"])
        assert c.first_k_dense_replace == want["first_k_dense_replace"]
        assert c.moe_intermediate_size == want["moe_intermediate_size"]
        if preset == "deepseek-v2-lite":
            assert (want["n_routed_experts"], want["n_shared_experts"], want["num_experts_per_tok"]) == (64, 2, 6)
            assert (want["first_k_dense_replace"], want["moe_intermediate_size"]) == (1, 1408)
            assert rope["rope_type"] == "yarn"
    else:  # Qwen1.5-MoE's and OLMoE's published configs leave head_dim out: hidden / heads
        derived = want["hidden_size"] // want["num_attention_heads"]
        assert getattr(c, "head_dim", derived) == want.get("head_dim", derived)
    if preset == "qwen3-30b-a3b":
        assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 8, 768)
        assert c.norm_topk_prob is True
        assert c.mlp_only_layers == []
    if preset == "llama-3.1-8b":
        assert rope["rope_type"] == "llama3"
        assert rope["factor"] == 8.0
        assert rope["original_max_position_embeddings"] == 8192


def test_llama_8b_preset_shape():
    p = mm.PRESETS["llama-3.1-8b"]
    assert (p["hidden_size"], p["intermediate_size"], p["num_hidden_layers"]) == (4096, 14336, 32)
    assert (p["num_attention_heads"], p["num_key_value_heads"], p["head_dim"]) == (32, 8, 128)
    assert p["rope_scaling"]["low_freq_factor"] == 1.0
    assert p["rope_scaling"]["high_freq_factor"] == 4.0


# ---------------------------------------------------------------- tokenizer


def test_determinism_across_roots_and_processes(built, tmp_path):
    """A fresh process (other hash seed, one tokenizer thread) into another
    root must produce the same directory name and byte-identical files."""
    here = built["cpu-tiny"]
    code = (
        "import sys; from pathlib import Path; from servelab.models import build as mm; "
        "print(mm.make_model('cpu-tiny', Path(sys.argv[1])))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(LIB_DIR),
        "PYTHONHASHSEED": "12345",
        "RAYON_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "other")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    there = Path(out.stdout.strip().splitlines()[-1])
    assert there.parent == tmp_path / "other"
    assert there.name == here.name
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        assert sha256_file(there / name) == sha256_file(here / name), name
    # the model revision a run records: the same for both builds, though their build records' timings differ
    # (two H100 runs of one preset once recorded two revisions)
    from servelab.measure.runinfo import model_revision
    assert model_revision(there, "dummy") == model_revision(here, "dummy")
    assert model_revision(there) == model_revision(here)


def test_train_tokenizer_deterministic_in_process():
    corpus = mm.load_corpus(budget_bytes=512 * 1024)
    a = mm.train_tokenizer(1024, corpus).to_str()
    b = mm.train_tokenizer(1024, corpus).to_str()
    assert hashlib.sha256(a.encode()).hexdigest() == hashlib.sha256(b.encode()).hexdigest()


def test_corpus_is_fixed_and_budgeted():
    c = mm.load_corpus()
    assert c.size_bytes == mm.CORPUS_BUDGET_BYTES
    assert c.files == sorted(c.files)
    assert not any(f.startswith(("site-packages/", "_sysconfigdata")) for f in c.files)
    assert not any("/test/" in f"/{f}" or "/tests/" in f"/{f}" for f in c.files)
    assert mm.load_corpus().sha256 == c.sha256


def test_chat_template_generation_prompt(tiny_tok):
    tok = tiny_tok
    ids = chat_ids(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    start, end, eot = tok.convert_tokens_to_ids(
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    )
    assert ids[0] == tok.bos_token_id
    assert ids.count(start) == 2 and ids.count(end) == 2 and ids.count(eot) == 1
    assert tok.decode(ids) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    header = tok.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False)
    assert ids[-len(header) :] == header

    no_prompt = chat_ids(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert no_prompt[-1] == eot


def test_chat_template_roles_parts_and_thinking(tiny_tok):
    tok = tiny_tok
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    off = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    on = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert off == text
    assert on == text + "<think>\n"


@pytest.mark.parametrize("preset", ["cpu-tiny", "llama-3.1-8b"])
def test_encode_decode_round_trip(built, preset):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built[preset])
    text = (
        "def f(x: int) -> int:\n\treturn x ** 2  # héllo 世界 🚀\r\n"
        "  naïve   spaces\u00a0and\x00nul\x7f  \n\n'quote's 12345678\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.unk_token_id is None or tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    with_bos = tok.encode(text)
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == ids


def test_tokenizer_learned_merges(tiny_tok):
    # Held-out Python source (json/ sorts after the corpus cut-off) compresses
    # well: ~2.9 bytes/token at vocab 4096; merges-free byte level would be 1.0.
    assert "json/__init__.py" not in mm.load_corpus().files
    text = Path(json.__file__).read_text()[:8000]
    n_tokens = len(tiny_tok.encode(text, add_special_tokens=False))
    assert len(text.encode()) / n_tokens > 2.5


# ---------------------------------------------------------------- cache


def test_cache_reuse_does_not_rebuild(built, root):
    d = built["cpu-tiny"]
    before = {p.name: p.stat().st_mtime_ns for p in [d, *d.iterdir()]}
    inode = d.stat().st_ino
    again = mm.make_model("cpu-tiny", root)
    assert again == d
    assert d.stat().st_ino == inode
    assert {p.name: p.stat().st_mtime_ns for p in [d, *d.iterdir()]} == before


def test_force_rebuilds_in_place(tmp_path):
    d = mm.make_model("cpu-tiny", tmp_path)
    tok_hash, inode = sha256_file(d / "tokenizer.json"), d.stat().st_ino
    d2 = mm.make_model("cpu-tiny", tmp_path, force=True)
    assert d2 == d
    assert d.stat().st_ino != inode
    assert sha256_file(d / "tokenizer.json") == tok_hash
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name]


def test_cache_key_changes_with_preset_and_recipe(built, root, monkeypatch):
    base = built["cpu-tiny"]
    original = mm.PRESETS["cpu-tiny"]
    changed = copy.deepcopy(original)
    changed["num_hidden_layers"] = 9
    monkeypatch.setitem(mm.PRESETS, "cpu-tiny", changed)
    d_layers = mm.make_model("cpu-tiny", root)
    assert d_layers != base
    assert json.loads((d_layers / "config.json").read_text())["num_hidden_layers"] == 9

    monkeypatch.setitem(mm.PRESETS, "cpu-tiny", original)
    assert mm.make_model("cpu-tiny", root) == base
    monkeypatch.setattr(mm, "RECIPE_VERSION", mm.RECIPE_VERSION + "-test")
    d_recipe = mm.make_model("cpu-tiny", root)
    assert d_recipe not in (base, d_layers)


def test_cache_key_changes_with_corpus(built, root, monkeypatch):
    # Another Python version means other stdlib text: it must not reuse the dir.
    real_load_corpus = mm.load_corpus
    monkeypatch.setattr(mm, "load_corpus", lambda: real_load_corpus(budget_bytes=1024 * 1024))
    d = mm.make_model("cpu-tiny", root)
    assert d != built["cpu-tiny"]
    manifest = json.loads((d / "servelab_model.json").read_text())
    assert manifest["corpus"]["size_bytes"] == 1024 * 1024


def test_interrupted_build_leaves_nothing_finished(tmp_path, monkeypatch):
    real_write_json = mm._write_json

    def failing_write_json(path: Path, obj) -> None:
        if path.name == "generation_config.json":
            raise KeyboardInterrupt("simulated interruption")
        real_write_json(path, obj)

    monkeypatch.setattr(mm, "_write_json", failing_write_json)
    with pytest.raises(KeyboardInterrupt):
        mm.make_model("cpu-tiny", tmp_path)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(mm, "_write_json", real_write_json)
    d = mm.make_model("cpu-tiny", tmp_path)
    assert (d / "generation_config.json").is_file()


def test_half_written_dir_is_rebuilt(tmp_path):
    d = mm.make_model("cpu-tiny", tmp_path)
    (d / "servelab_model.json").unlink()  # as if a finished marker never came
    again = mm.make_model("cpu-tiny", tmp_path)
    assert again == d and (d / "servelab_model.json").is_file()


def test_default_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path / "envcache"))
    assert mm.default_cache_root() == tmp_path / "envcache" / "models"

    monkeypatch.delenv("SERVELAB_CACHE")
    project = tmp_path / "proj"
    (project / "a" / "b").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname='x'\n")
    (project / "lib" / "servelab").mkdir(parents=True)  # a servelab checkout
    monkeypatch.chdir(project / "a" / "b")
    assert mm.default_cache_root() == project.resolve() / ".cache" / "servelab" / "models"

    lone = tmp_path / "lone"
    lone.mkdir()
    monkeypatch.chdir(lone)
    monkeypatch.setattr("servelab.paths.project_root", lambda *a, **kw: None)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mm.default_cache_root() == tmp_path / "home" / ".cache" / "servelab" / "models"


# ---------------------------------------------------------------- facts


def test_model_facts_cpu_tiny(built):
    f = mm_facts.model_facts(built["cpu-tiny"])
    assert f["architecture"] == "LlamaForCausalLM"
    assert (f["hidden_size"], f["num_layers"], f["num_heads"], f["num_kv_heads"]) == (512, 8, 8, 2)
    assert (f["head_dim"], f["vocab_size"], f["dtype"]) == (64, 4096, "bfloat16")
    assert "active_param_count" not in f and "kv_lora_rank" not in f
    # 2 (K,V) x 8 layers x 2 kv heads x 64 dims x 2 bytes
    assert f["kv_cache_bytes_per_token"] == 4096
    # Untied lm_head: 24,650,240 in embedding + layers + norm, plus 2,097,152.
    assert f["param_count"] == 26_747_392
    assert 24.0e6 <= f["param_count"] - f["lm_head_param_count"] <= 25.2e6
    assert f["weight_bytes"] == 2 * f["param_count"]


def test_model_facts_moe_and_mla(built):
    q = mm_facts.model_facts(built["qwen3-30b-a3b"])
    assert (q["num_experts"], q["num_active_experts"], q["head_dim"]) == (128, 8, 128)
    assert q["active_param_count"] < q["param_count"]
    ds = mm_facts.model_facts(built["deepseek-v2-lite"])
    assert (ds["kv_lora_rank"], ds["qk_rope_head_dim"], ds["num_experts"]) == (512, 64, 64)
    assert (ds["num_active_experts"], ds["num_shared_experts"], ds["head_dim"]) == (6, 2, 192)
    assert ds["kv_cache_bytes_per_token"] == 27 * (512 + 64) * 2


def test_param_counts_reference_vocab(built):
    llama = mm_facts.model_facts(built["llama-3.1-8b"], vocab_size=128256)
    assert 7.9e9 <= llama["param_count"] <= 8.1e9
    qwen = mm_facts.model_facts(built["qwen3-30b-a3b"], vocab_size=151936)
    assert qwen["param_count"] == pytest.approx(30.5e9, rel=0.03)
    assert qwen["active_param_count"] == pytest.approx(3.3e9, rel=0.03)
    ds = mm_facts.model_facts(built["deepseek-v2-lite"], vocab_size=102400)
    assert ds["param_count"] == pytest.approx(15.7e9, rel=0.03)
    # The served dirs carry a 32000 vocab: fewer embedding/lm_head weights.
    assert mm_facts.model_facts(built["llama-3.1-8b"])["param_count"] < llama["param_count"]


@pytest.mark.parametrize("preset", list(mm.PRESETS))
def test_param_count_matches_transformers_model(preset):
    cfg = mm.PRESETS[preset]
    total, model = meta_model_param_counts(cfg)
    f = mm_facts.facts_from_config(cfg)
    assert f["param_count"] == total
    if "active_param_count" in f:
        # Independent active count: drop the unused routed experts per MoE layer.
        inactive = 0
        for layer in model.model.layers:
            block = next((c for c in layer.children() if hasattr(c, "experts")), None)  # mlp, block_sparse_moe
            experts = getattr(block, "experts", None)
            if experts is None:
                continue
            n = sum(p.numel() for p in experts.parameters())
            n_experts = f["num_experts"]
            inactive += n // n_experts * (n_experts - f["num_active_experts"])
        assert inactive > 0
        assert f["active_param_count"] == total - inactive


# ---------------------------------------------------------------- vLLM


def test_vllm_reads_config_and_tokenizer(built):
    pytest.importorskip("vllm")
    from vllm.tokenizers import get_tokenizer
    from vllm.transformers_utils.config import get_config

    d = built["cpu-tiny"]
    cfg = get_config(str(d), trust_remote_code=False)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (512, 8, 4096)
    tok = get_tokenizer(str(d))
    assert len(tok) == 4096
    ids = tok.encode("print('hi')")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "print('hi')"
