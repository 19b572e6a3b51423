"""SYSTEM_PACKAGES=1 where the machine's python3 is itself a virtualenv (an image's /opt/torch/.venv with CUDA
PyTorch, seen on an H100 host): a venv made from it with --system-site-packages sees the base interpreter's
packages, not that venv's, until scripts/system_packages.py names them in a .pth file. This test's own
virtualenv stands in for the image's."""

from __future__ import annotations

import subprocess
import sys

from paths import ROOT

PROBE = "import pandas, sys; print(pandas.__file__)"


def test_a_venv_made_from_a_venv_sees_its_packages_after_the_script(tmp_path):
    assert sys.prefix != sys.base_prefix  # the tests run in servelab's .venv: a virtualenv, like the image's
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    before = subprocess.run([py, "-c", PROBE], capture_output=True, text=True)
    if before.returncode == 0:  # the base interpreter has pandas itself: the case cannot be told apart here
        assert not before.stdout.startswith(sys.prefix)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "system_packages.py"), str(venv)],
                       capture_output=True, text=True, check=True)
    assert "also sees" in r.stdout
    after = subprocess.run([py, "-c", PROBE], capture_output=True, text=True, check=True)
    assert after.stdout.startswith(sys.prefix)  # pandas from the image's venv, found through the .pth file
    own = subprocess.run([py, "-c", "import sys; print(sys.path)"], capture_output=True, text=True, check=True).stdout
    assert own.index(str(venv)) < own.index(sys.prefix + "/lib")  # the new venv's own packages come first
