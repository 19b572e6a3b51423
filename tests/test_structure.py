"""The shape of the library: layers enforced by import-linter, no module over 500 lines, and
engine- and host-specific decisions only inside their registries."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib" / "servelab"
MAX_LINES = 500


def _modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_import_layers_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (dev extra)")
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "1 kept, 0 broken" in r.stdout, r.stdout[-2000:]


KIND_TEST = re.compile(r"""(kind|mode)\s*(==|!=|in)\s*\(?\s*["'](vllm|sglang|local|attach|aws-ecs|aws-instance)["']""")


def test_engine_and_host_kinds_are_decided_in_their_registries():
    found = []
    for p in _modules():
        rel = p.relative_to(LIB)
        if rel.parts[0] in ("engines", "hosts"):
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if KIND_TEST.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert found == []


def test_the_schema_imports_no_pandas():
    code = ("import sys; import servelab.schema; "
            "print(sorted(m for m in ('pandas', 'boto3', 'matplotlib', 'httpx') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
