"""Each stage notebook run the way JupyterLab runs it: the .py file opened through jupytext, the
kernel started in notebooks/, top to bottom with its default parameters. With the defaults none
of them needs a server: provision builds the model directory, launch and benchmark show what
they would start, diagnose and the write-up explore the published default study."""

from __future__ import annotations

import jupytext
import pytest
from nbclient import NotebookClient
from paths import ROOT

NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("0*.py"))
pytestmark = pytest.mark.notebooks


def outputs(nb) -> str:
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            parts.append(o.get("text", "") + "".join(str(v) for v in (o.get("data") or {}).values()))
    return "\n".join(parts)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom_from_notebooks_dir(name):
    nb = jupytext.read(ROOT / "notebooks" / name)
    assert nb.metadata["kernelspec"]["name"] == "python3"  # papermill needs no -k
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = outputs(nb)
    expected = {"01_provision.py": "cpu-tiny", "02_launch.py": "nothing started",
                "03_benchmark.py": "no request sent", "04_diagnose.py": "KV usage max",
                "05_writeup.py": "What we found"}[name]
    assert expected in text
    if name == "02_launch.py":
        assert "vllm.entrypoints.openai.api_server" in text
