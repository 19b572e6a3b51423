"""The default study (params/local-cpu.yaml) on the real model: it validates, and its dry run
prints the launch commands that differ by exactly one lever from the eager baseline (and the
baseline's again, the A/A repeat)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from servelab.schema import load_study
from paths import ROOT



def _dry_run() -> dict[str, list[str]]:
    """{config id: launch command words} from `servelab run --dry-run` ("[id] launch: python ...")."""
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "run", "params/local-cpu.yaml", "--dry-run"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    found = (re.match(r"^\[(?P<cid>[\w-]+)\] launch: (?P<cmd>.*)$", ln) for ln in r.stdout.splitlines())
    return {m["cid"]: shlex.split(m["cmd"]) for m in found if m}


def test_the_default_study_is_the_real_model_one_change_at_a_time():
    s = load_study(ROOT / "params" / "local-cpu.yaml")
    assert s.engine.model.preset == "smollm2-135m"
    assert [c.id for c in s.configurations] == ["eager", "compiled", "ngram", "budget", "eager-again", "eager-third"]
    for aa in s.configurations[-2:]:  # the A/A repeats: the baseline started twice more
        assert aa.baseline == "eager" and not aa.engine
    assert s.engine.args["dtype"] == "float32"  # answers that do not depend on the CPU's instruction set
    assert {b.prompt_set for b in s.workload.buckets} == {"rewrite", "code"}
    assert s.translations == ["ja"]


def _without_port(cmd: list[str]) -> list[str]:
    i = cmd.index("--port")
    return cmd[:i] + cmd[i + 2:]


def test_dry_run_prints_the_compiled_and_ngram_launch_commands():
    found = _dry_run()
    ids = ("eager", "compiled", "ngram", "budget", "eager-again", "eager-third")
    ports = [found[c][found[c].index("--port") + 1] for c in ids]
    assert ports == ["8011", "8012", "8013", "8014", "8015", "8016"]  # side by side: one port each
    cmds = {c: _without_port(x) for c, x in found.items()}
    assert set(cmds) == set(ids), cmds
    assert cmds["eager-again"] == cmds["eager"] == cmds["eager-third"]  # the A/A repeats start the baseline again
    assert "--enforce-eager" in cmds["eager"] and "--enforce-eager" not in cmds["compiled"]
    spec = cmds["ngram"][cmds["ngram"].index("--speculative-config") + 1]
    assert '"method":"ngram"' in spec.replace(" ", "") and '"num_speculative_tokens":4' in spec.replace(" ", "")
    assert cmds["budget"][cmds["budget"].index("--max-num-batched-tokens") + 1] == "128"
    base = set(cmds["eager"])
    assert set(cmds["compiled"]) == base - {"--enforce-eager"}  # nothing else differs
