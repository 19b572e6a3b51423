"""Where things live: the repository root (found from the current folder or from this
package, so a kernel started in notebooks/ finds it), the runs, reports and cache folders
(each overridable by an environment variable), and relative paths taken from the root.
Standard library only: every layer may use it."""

from __future__ import annotations

import os
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
