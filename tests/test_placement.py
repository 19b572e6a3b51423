"""Where a study's engines go (`servelab.placement`), against stand-in GPUs (`measure.inventory`'s
SERVELAB_GPUS: 1, 2 and 8 GPUs of 80 and 141 GB): lanes side by side, a layout wider than the machine refused
before anything starts, two engines at vLLM's default memory share never on one GPU, groups that fit and that
do not, old params with `device:` placed as before, and the refusal of one attached URL measured under several
engine settings."""

from __future__ import annotations

import copy

import pytest
import yaml

from paths import ROOT
from servelab.measure.inventory import Gpu, InventoryError, stand_in
from servelab.placement import PlacementError, plan
from servelab.schema import ParamsError, Study, load_study

H100, H200 = "H100", "H200"
GIB = 2**30


def _study(configs: list[dict], placement: dict | None = None, engine_args: dict | None = None) -> Study:
    data = {"study": "p", "title": "t", "engine": {"kind": "vllm", "model": {"preset": "llama-3.1-8b"},
                                                    "args": engine_args or {}},
            "workload": {"buckets": [{"input_tokens": 16, "output_tokens": 8}], "concurrency": [1]},
            "configurations": configs}
    if placement is not None:
        data["placement"] = placement
    return Study.model_validate(data)


def _where(p) -> dict[str, tuple[int, ...]]:
    return {c: s.gpus for s in p.servers() for c in s.configs}


def _groups(p) -> list[list[str]]:
    return [[s.id for s in g.servers] for phase in p.phases for lane in phase for g in lane.groups]


def _ids(s: Study) -> list[str]:
    return [c.id for c in s.configurations]


@pytest.mark.parametrize("spec", ["2xH200", "8xH100", "8xH200"])
def test_the_seed_001_study_runs_two_lanes_then_tp2_on_two_gpus(spec):
    s = load_study(ROOT / "params" / "h200-llama8b-vllm.yaml")
    p = plan(s, _ids(s), stand_in(spec))
    where = _where(p)
    assert {where[c] for c in ("eager", "mnbt-2048", "mnbt-8192")} == {(0,)}
    assert {where[c] for c in ("cudagraph", "cudagraph-saturation", "mnbt-4096", "mnbt-16384")} == {(1,)}
    assert where["tp2"] == where["tp2-saturation"] == (0, 1)
    assert len(p.phases) == 2 and len(p.phases[0]) == 2  # the lanes side by side, then TP=2
    servers = p.servers()
    assert len({s.engine.port for s in servers}) == len(servers) == 7  # one server per engine, each its own port
    assert p.server_of("cudagraph") is p.server_of("cudagraph-saturation")  # an identical engine: one server
    assert p.server_of("tp2").engine.env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_tp2_layout_on_one_gpu_is_refused_before_anything_starts():
    s = load_study(ROOT / "params" / "h200-llama8b-vllm.yaml")
    with pytest.raises(PlacementError) as e:
        plan(s, _ids(s), stand_in("1xH100"), source="params/h200-llama8b-vllm.yaml")
    lines = str(e.value).splitlines()
    assert len(lines) == 1 and "tp2, tp2-saturation" in lines[0] and "takes 2 GPUs" in lines[0]
    one = plan(s, ["eager", "cudagraph"], stand_in("1xH100"))  # its one-GPU configurations alone: one after another
    assert _groups(one) == [["eager"], ["cudagraph"]] and set(_where(one).values()) == {(0,)}


@pytest.mark.parametrize("spec", ["1xH100", "1xH200"])
def test_two_engines_at_the_default_memory_share_never_share_a_gpu(spec):
    s = _study([{"id": "a"}, {"id": "b", "engine": {"args": {"enforce-eager": True}}}])
    p = plan(s, _ids(s), stand_in(spec))
    assert _groups(p) == [["a"], ["b"]]
    assert p.servers()[0].memory_bytes == pytest.approx(0.9 * stand_in(spec)[0].total_bytes)


def test_servers_whose_memory_settings_fit_start_together_and_the_rest_after():
    two = _study([{"id": "a"}, {"id": "b", "engine": {"args": {"enforce-eager": True}}}],
                 engine_args={"gpu-memory-utilization": 0.4})
    assert _groups(plan(two, _ids(two), stand_in("1xH100"))) == [["a", "b"]]  # 0.4 + 0.4 of 80 GB fit
    three = _study([{"id": "a"}, {"id": "b", "engine": {"args": {"enforce-eager": True}}},
                    {"id": "c", "engine": {"args": {"max-num-seqs": 8}}}], engine_args={"gpu-memory-utilization": 0.4})
    assert _groups(plan(three, _ids(three), stand_in("1xH100"))) == [["a", "b"], ["c"]]  # a third does not
    alone = _study(two.model_dump()["configurations"], placement={"share_gpu": False},
                   engine_args={"gpu-memory-utilization": 0.4})
    assert _groups(plan(alone, _ids(alone), stand_in("1xH100"))) == [["a"], ["b"]]


def test_a_fixed_kv_pool_counts_the_weights_beside_it():
    """kv-cache-memory-bytes: weights (the model's facts) + the pool + an allowance, at least the share vLLM checks."""
    s = _study([{"id": "a"}, {"id": "b", "engine": {"args": {"enforce-eager": True}}}],
               engine_args={"gpu-memory-utilization": 0.2, "kv-cache-memory-bytes": "8G"})
    p = plan(s, _ids(s), stand_in("1xH200"))
    a = p.servers()[0]
    assert 16e9 < a.memory_bytes - 8 * GIB < 16e9 + 4 * GIB and "weights" in a.memory_how  # an 8B model's 16 GB
    assert _groups(p) == [["a", "b"]]
    assert _groups(plan(s, _ids(s), [Gpu(0, "small", 60 * GIB, 40 * GIB)])) == [["a"], ["b"]]  # 2 x 27 GiB > 40


def test_a_server_that_needs_more_memory_than_any_gpu_has_free_is_refused():
    s = _study([{"id": "a"}])
    busy = [Gpu(0, "NVIDIA H100 80GB HBM3", 80 * GIB, 20 * GIB, processes=(4242,))]
    with pytest.raises(PlacementError, match=r"a: its memory settings need 72.0 GiB .* 20.0 GiB"):
        plan(s, ["a"], busy)


def test_eight_gpus_take_one_gpu_servers_side_by_side():
    s = _study([{"id": f"c{i}", "engine": {"args": {"max-num-seqs": 8 * (i + 1)}}} for i in range(4)])
    p = plan(s, _ids(s), stand_in("8xH100"))
    assert len(p.phases) == 1 and len(p.phases[0]) == 4
    assert sorted(_where(p).values()) == [(0,), (1,), (2,), (3,)]


def test_a_study_on_gpus_is_refused_on_a_machine_without_one_in_one_line():
    s = load_study(ROOT / "params" / "h200-smollm2-load.yaml")
    with pytest.raises(PlacementError) as e:
        plan(s, _ids(s), [], source="params/h200-smollm2-load.yaml")
    assert len(str(e.value).splitlines()) == 1 and "no NVIDIA GPU" in str(e.value)
    cpu = _study([{"id": "a"}])
    assert plan(cpu, ["a"], []).cpu  # no placement block, no GPU: the CPU's side-by-side design
    assert plan(_study([{"id": "a"}], placement={"gpus": 0}), ["a"], stand_in("1xH100")).cpu


def test_old_params_with_a_device_block_load_and_place_as_before():
    new = yaml.safe_load((ROOT / "params" / "h200-moe.yaml").read_text())
    old = copy.deepcopy(new)
    dev = {**old.pop("placement"), "peers": old.pop("peers"), "checks": old.pop("checks"),
           "capacity": old.pop("capacity_runs"), "site": {"vllm": "/opt/site"}}
    old["device"] = dev
    a, b = Study.model_validate(new), Study.model_validate(old)
    assert a.placement == b.placement and a.peers == b.peers and a.checks == b.checks
    assert a.capacity_runs == b.capacity_runs
    pa, pb = plan(a, _ids(a), stand_in("1xH200")), plan(b, _ids(b), stand_in("1xH200"))
    assert _groups(pa) == _groups(pb) == [["vllm-cudagraph", "vllm-fp8kv", "vllm-eager", "smol-ngram", "smol-bf16",
                                           "smol-fp8kv"], ["sglang-fp8kv", "vllm-mnbt-16384", "sglang-cudagraph"]]
    assert _where(pa) == _where(pb)
    lanes = {k: v for k, v in yaml.safe_load((ROOT / "params" / "h200x2-layouts.yaml").read_text()).items()}
    lanes["device"] = {**lanes.pop("placement"), "site": {"vllm": "/x"}}  # old default: gpus from the block
    old2 = Study.model_validate(lanes)
    assert old2.placement.gpus == 2 and old2.placement.lanes == [["dense-tp1"], ["moe-tp1"]]


def test_one_attached_url_is_refused_for_configurations_whose_engines_differ(tmp_path):
    base = {"study": "a", "title": "t", "host": {"kind": "attach", "attach": {"url": "http://127.0.0.1:9"}},
            "engine": {"kind": "vllm", "model": {"preset": "cpu-tiny"}},
            "workload": {"buckets": [{"input_tokens": 16, "output_tokens": 8}], "concurrency": [1]},
            "configurations": [{"id": "eager", "engine": {"args": {"enforce-eager": True}}}, {"id": "graphs"}]}
    p = tmp_path / "a.yaml"
    p.write_text(yaml.safe_dump(base))
    with pytest.raises(ParamsError) as e:
        load_study(p)
    assert len(str(e.value).splitlines()) == 1 and "eager, graphs" in str(e.value) and "own url" in str(e.value)
    base["configurations"][1]["url"] = "http://127.0.0.1:10"
    base["configurations"][0]["url"] = "http://127.0.0.1:11"
    p.write_text(yaml.safe_dump(base))
    assert load_study(p).config("graphs").url == "http://127.0.0.1:10"
    one = {**base, "configurations": [{"id": "x"}, {"id": "y", "workload": {"concurrency": [2]}}]}
    p.write_text(yaml.safe_dump(one))
    assert len(load_study(p).configurations) == 2  # one engine, two workloads: one server is right


def test_stand_in_specs_are_read_or_refused_in_one_line():
    assert [g.total_bytes for g in stand_in("2xH200")] == [141e9, 141e9]
    js = stand_in('[{"name": "NVIDIA A100", "memory_gib": 40, "free_gib": 30}]')
    assert js[0].free_bytes == 30 * GIB and js[0].name == "NVIDIA A100"
    with pytest.raises(InventoryError, match="unknown GPU 'Z9'"):
        stand_in("1xZ9")
    with pytest.raises(InventoryError, match="COUNTxNAME"):
        stand_in("two H100s")


def test_an_engine_starts_from_its_own_python(tmp_path, monkeypatch):
    """engine.python, else SERVELAB_<KIND>_PYTHON, else the user config's engines.<kind>.python; a virtualenv's folder
    stands for its bin/python; a Python that is not there is one error naming where it was set."""
    from servelab.hosts.process import EngineError, engine_python
    from servelab.schema import EngineParams

    venv = tmp_path / "sglang-env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("SERVELAB_SGLANG_PYTHON", raising=False)
    assert engine_python(EngineParams(kind="sglang")) is None  # servelab's own
    (tmp_path / "cfg" / "servelab").mkdir(parents=True)
    (tmp_path / "cfg" / "servelab" / "config.yaml").write_text(f"engines:\n  sglang: {{python: {venv}}}\n")
    assert engine_python(EngineParams(kind="sglang")) == str(venv / "bin" / "python")
    assert engine_python(EngineParams(kind="vllm")) is None
    monkeypatch.setenv("SERVELAB_SGLANG_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(EngineError, match="SERVELAB_SGLANG_PYTHON: .*nope/python does not exist"):
        engine_python(EngineParams(kind="sglang"))
    assert engine_python(EngineParams(kind="sglang", python=str(venv))) == str(venv / "bin" / "python")
