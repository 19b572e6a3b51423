"""Model directories in servelab's cache are built in a temporary folder beside their final name
and moved into place in one rename, so a reader never sees half a model; this is that move."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def move_into_place(tmp: Path, final: Path) -> Path:
    """Replace `final` with the finished build `tmp` (a rename; an older `final` is moved aside
    first and then removed). Returns `final`."""
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=final.parent))
        os.rename(final, trash / "d")
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    return final
