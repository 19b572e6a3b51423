"""The root of every error servelab raises on purpose: `ServelabError`.

Each library error derives from it (and, where callers already catch a built-in class such as
ValueError or RuntimeError, from that too), so the CLI catches one class and prints one line.
Signals are not errors: `pipeline.Stopped` stays a KeyboardInterrupt. This module imports
nothing of servelab (the bottom layer)."""

from __future__ import annotations


class ServelabError(Exception):
    """Something servelab refused or could not do; the message is one line a user can act on."""


__all__ = ["ServelabError"]
