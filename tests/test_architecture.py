"""docs/architecture.md holds the layers as they are: its table lists the import-linter contract's
layers in order (pyproject.toml), and every module under lib/servelab/ belongs to one of them."""

from __future__ import annotations

import re
import tomllib

from paths import ROOT


def _documented() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("<!-- layers -->", 1)[1].split("<!-- /layers -->", 1)[0]
    return re.findall(r"^\| `(servelab[.\w]*)` \|", block, re.M)


def _contract() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = next(c for c in cfg["tool"]["importlinter"]["contracts"] if c["name"] == "servelab layers")["layers"]
    return layers


def test_the_page_lists_the_contract_layers_in_order():
    assert _documented() == _contract()


def test_every_module_belongs_to_a_documented_layer():
    layers = set(_documented())
    lib = ROOT / "lib" / "servelab"
    orphans = []
    for p in sorted(lib.rglob("*.py")):
        if p.name == "__init__.py" and p.parent == lib:
            continue
        rel = p.relative_to(lib).with_suffix("")
        top = f"servelab.{rel.parts[0]}"
        if top not in layers:
            orphans.append(str(rel))
    assert orphans == []
