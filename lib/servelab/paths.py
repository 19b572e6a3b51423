"""Where things live: the repository root (found from the current folder or from this
package, so a kernel started in notebooks/ finds it), the runs, reports and cache folders
(each overridable by an environment variable), and relative paths taken from the root.
Standard library only: every layer may use it."""

from __future__ import annotations

import os
import re
from pathlib import Path


def project_root(start: Path | None = None, default: Path | None | str = "cwd") -> Path | None:
    """The nearest folder at or above `start` (default: the current folder) holding
    pyproject.toml and lib/servelab, else the checkout this package is installed from, else
    `default` (the current folder unless given). Notebooks started in notebooks/ find the
    repository root this way."""
    for base in (start or Path.cwd(), Path(__file__)):
        p = Path(base).resolve()
        for d in (p, *p.parents):
            if (d / "pyproject.toml").is_file() and (d / "lib" / "servelab").is_dir():
                return d
    return Path.cwd().resolve() if default == "cwd" else default  # type: ignore[return-value]


def runs_root() -> Path:
    return Path(os.environ.get("SERVELAB_RUNS") or project_root() / "runs")


def reports_root() -> Path:
    return Path(os.environ.get("SERVELAB_REPORTS") or project_root() / "reports")


def resolve(path: str | Path) -> Path:
    """A relative path from a params file or notebook parameter, taken from the repository
    root when it does not exist from the current folder (a kernel started in notebooks/)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    root = project_root()
    return root / p if root is not None and (root / p).exists() else p


def cache_root() -> Path:
    """servelab's cache: $SERVELAB_CACHE, else <repository>/.cache/servelab, else ~/.cache/servelab."""
    env = os.environ.get("SERVELAB_CACHE")
    if env:
        return Path(env).expanduser()
    root = project_root(default=None)
    return (root / ".cache" / "servelab") if root is not None else Path.home() / ".cache" / "servelab"


# -- paths that leave this machine ---------------------------------------------------------------
# A published page or run file must not carry where it ran: the clone's folder, a temp folder, a home
# folder, the GPU machine's install folders. `portable` rewrites them as paths relative to the
# project root or as named placeholders, in this order (the first that matches a path wins).
_MARKERS = ("runs", "reports", "notebooks", "params", "lib/servelab", ".venv", "scripts", "tests")
_PORTABLE = [
    # the model and compile cache, wherever the project was: $SERVELAB_CACHE
    (r"(?:/[^\s\"'`,;:=()\[\]{}<>|]+?)?/\.cache/servelab(?=/|\b)", "$SERVELAB_CACHE"),
    # Python installs (a venv, --target folders, the system's): $SITE_PACKAGES/<package>
    (r"/[^\s\"'`,;:=()\[\]{}<>|]*?/(?:lib/python3(?:\.\d+)?/)?(?:site|dist)-packages(?=/|\b)", "$SITE_PACKAGES"),
    (r"/root/site(?:-[a-z0-9]+)?(?=/|\b)", "$SITE_PACKAGES"),
    # a project's own folders: relative to its root
    (r"/[^\s\"'`,;:=()\[\]{}<>|]+?/(?=(?:" + "|".join(m.replace(".", r"\.") for m in _MARKERS) + r")(?:/|\b))", ""),
    # what remains of a temp folder, a home folder, an /opt install
    (r"/tmp/[^\s\"'`,;:=()\[\]{}<>|]*", "$TMPDIR"),
    (r"/(?:root|home/[^\s/\"'`,;:=()\[\]{}<>|]+)(?=/|\b)", "~"),
    (r"/opt/[^\s/\"'`,;:=()\[\]{}<>|]+", "$OPT"),
]


def portable(text: str, root: Path | None = None) -> str:
    """`text` with this machine's paths rewritten (see `_PORTABLE`): the cache first, then `root`
    (default: the project root) made relative, so its own files keep their names, then the rest."""
    root = root or project_root(default=None)
    (cache, cache_repl), rest = _PORTABLE[0], _PORTABLE[1:]
    text = re.sub(cache, cache_repl, text)
    if root is not None:
        text = text.replace(str(Path(root).resolve()) + "/", "")
    for pattern, repl in rest:
        text = re.sub(pattern, repl, text)
    return text


def portable_tree(folder: Path) -> list[Path]:
    """Rewrite every text file under `folder` with `portable`; returns the files it changed."""
    changed = []
    for p in Path(folder).rglob("*"):
        if not p.is_file():
            continue
        try:
            txt = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        new = portable(txt)
        if new != txt:
            p.write_text(new, encoding="utf-8")
            changed.append(p)
    return changed
