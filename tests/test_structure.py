"""The shape of the library: layers enforced by import-linter, no module over 600 lines (a guard against a
module holding two concepts, not the rule that decides where code lives: that is the concept), and
engine- and host-specific decisions only inside their registries."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

LIB = ROOT / "lib" / "servelab"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_import_layers_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (dev extra)")
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "2 kept, 0 broken" in r.stdout, r.stdout[-2000:]


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


def _strings(node: ast.AST) -> set[str]:
    """The string constants a comparison operand holds (a literal, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def engine_kind_branches(tree: ast.AST, kinds: set[str]) -> list[int]:
    """Lines that decide on an engine kind by its value, whatever the variable is called: a comparison
    (==, !=, in) with one of the registry's kinds, a `case "vllm":`, a startswith/endswith on one, or a
    dict keyed by them."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            hit = any(_strings(x) & kinds for x in (n.left, *n.comparators))
        elif isinstance(n, ast.MatchValue):
            hit = bool(_strings(n.value) & kinds)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("startswith", "endswith"):
            hit = any(_strings(a) & kinds for a in n.args)
        elif isinstance(n, ast.Dict):
            hit = any(k is not None and _strings(k) & kinds for k in n.keys)
        else:
            hit = False
        if hit:
            lines.append(n.lineno)
    return lines


def test_no_engine_kind_branches_outside_engines():
    """The engine registry's kinds, found by value: nothing outside engines/ compares or matches them."""
    from servelab.engines import KINDS

    found = [f"{p.relative_to(LIB)}:{line}" for p in _modules() if p.relative_to(LIB).parts[0] != "engines"
             for line in engine_kind_branches(ast.parse(p.read_text()), set(KINDS))]
    assert found == []


def test_the_engine_kind_scan_finds_a_branch_by_value():
    code = ("def f(engine, k, d):\n    if engine == 'sglang': pass\n    x = k in ('vllm', 'other')\n"
            "    match d:\n        case 'vllm': pass\n    return {'sglang': 1}, d.startswith('vllm')\n")
    assert sorted(engine_kind_branches(ast.parse(code), {"vllm", "sglang"})) == [2, 3, 5, 6, 6]
    assert engine_kind_branches(ast.parse("x = a == 'local'"), {"vllm", "sglang"}) == []


def test_the_schema_imports_no_pandas():
    code = ("import sys; import servelab.schema; "
            "print(sorted(m for m in ('pandas', 'boto3', 'matplotlib', 'httpx') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: top level and inside functions, not the ones under
    `if TYPE_CHECKING:` (annotations only)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(child)
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, set[str]]:
    """servelab module -> the servelab modules it imports at run time (lazy imports included).
    `from pkg import name` imports pkg, and pkg.name too where that is a module."""
    paths = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
                continue
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            edges.add(target)
            edges |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in paths}
        graph[name] = {e for e in edges if e in paths and e != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected group of modules (Tarjan, then BFS)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for group in groups:
        start = min(group)
        prev: dict[str, str] = {}
        frontier, seen = [start], {start}
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w == start and start not in prev:
                        prev[start] = v
                    elif w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path, v = [start], prev[start]
        while v != start:
            path.append(v)
            v = prev[v]
        cycles.append([start, *reversed(path[1:]), start])
    return cycles


def test_no_import_cycle_at_run_time():
    cycles = import_cycles(import_graph())
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_lazy_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    tree = ast.parse("def f():\n    from . import x\nif TYPE_CHECKING:\n    import y\n")
    assert [type(n).__name__ for n in _runtime_imports(tree)] == ["ImportFrom"]


def test_every_library_error_derives_from_servelab_error():
    """One root (servelab.errors.ServelabError) for every exception class the library defines;
    execute.Stopped is a signal (a KeyboardInterrupt), not an error."""
    import importlib

    from servelab.errors import ServelabError

    found, outside = [], []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                cls = getattr(importlib.import_module(_module_name(p)), node.name, None)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    found.append(node.name)
                    if not issubclass(cls, ServelabError):
                        outside.append(f"{_module_name(p)}.{node.name}")
    assert outside == ["servelab.execute.Stopped"]
    assert len(found) >= 23


def test_the_host_registry_is_keyed_by_the_schema_kinds():
    """One list of kinds (schema.HOST_KINDS); each maps to its class, whose cost_basis is read
    without building a host."""
    from servelab import hosts
    from servelab.schema import HOST_KINDS

    assert tuple(hosts.HOSTS) == HOST_KINDS == hosts.KINDS
    assert {k: hosts.get(k).cost_basis for k in HOST_KINDS} == {
        "local": "local", "attach": "endpoint", "aws-ecs": "instance", "aws-instance": "instance"}
    with pytest.raises(ValueError, match="unknown host kind 'gce'"):
        hosts.get("gce")


def test_the_pipeline_imports_no_boto3():
    """The GPU device's image has no boto3: the hosts registry, the stages, the pipeline and the
    CLI load without it (the AWS stack and deadline modules are imported where they are called)."""
    code = ("import sys; import servelab.hosts, servelab.stages, servelab.pipeline, servelab.cli; "
            "print(sorted(m for m in ('boto3', 'botocore') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
