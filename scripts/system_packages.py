#!/usr/bin/env python3
"""SYSTEM_PACKAGES=1 (scripts/setup.sh): the machine's own packages, seen from servelab's virtualenv.

`python3 -m venv --system-site-packages` shows the new venv its base interpreter's packages. Where the machine's
python3 is itself a virtualenv (an image's /opt/torch/.venv with CUDA PyTorch), those are not the image's: this
writes a .pth file into VENV's site-packages naming the running Python's own site-packages, which Python adds
after VENV's own (VENV's versions win). Run with the python3 that made VENV:

    python3 scripts/system_packages.py .venv

Nothing is written where the running Python is no virtualenv (--system-site-packages already sees its packages).
Standard library only.
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

PTH = "_system_packages.pth"


def main(venv: str) -> int:
    if sys.prefix == sys.base_prefix:
        return 0
    target = subprocess.run([str(Path(venv) / "bin" / "python"), "-c",
                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    (Path(target) / PTH).write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    print(f"setup: {venv} also sees {sys.prefix}'s packages ({PTH})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".venv"))
