"""Print, one per line, the `uv pip install` options that make uv see what pip sees here: pip's
own configuration (`pip config list`: config files and PIP_* variables) for the index, extra
indexes, local wheel folders and constraint files. Used by scripts/setup.sh."""

from __future__ import annotations

import shlex
import subprocess
import sys

OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def uv_args(pip_config: str) -> list[str]:
    """`pip config list` lines (`global.find-links='/opt/wheels'`, `:env:.constraint='...'`)
    -> uv options; a value may hold several space-separated entries; repeats are dropped."""
    out: list[str] = []
    for line in pip_config.splitlines():
        key, sep, value = line.partition("=")
        opt = OPTIONS.get(key.rsplit(".", 1)[-1])
        if not sep or not opt:
            continue
        for v in shlex.split(value)[0].split() if value.strip() else []:
            if opt == "--index-url" and "--index-url" in out:
                continue
            pair = [opt, v]
            if not any(out[i:i + 2] == pair for i in range(0, len(out), 2)):
                out += pair
    # pip takes the best version from every index; uv's default stops at the first that has the package
    return out + ["--index-strategy", "unsafe-best-match"]


if __name__ == "__main__":
    cfg = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    print("\n".join(uv_args(cfg)))
