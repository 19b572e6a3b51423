"""YAML reading for servelab's own files (params, the shipped tables, the report's words): libyaml's parser
where PyYAML was built with it (`yaml.CSafeLoader`, 5-10x faster than the pure-Python one), else the pure-Python
`SafeLoader`. Both resolve tags with the same Python resolver (`SafeConstructor`), so a file loads to the same
values either way (every YAML file of the repository checked, 2026-12-06); only a parse error's wording differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """`yaml.safe_load` through `LOADER`."""
    return yaml.load(text, Loader=LOADER)


def load_file(path: str | Path, encoding: str | None = "utf-8") -> Any:
    """A YAML file's content (`safe_load`)."""
    return safe_load(Path(path).read_text(encoding=encoding))
