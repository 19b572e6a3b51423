"""The root of every error servelab raises on purpose: `ServelabError`.

Each library error derives from it (and, where callers already catch a built-in class such as
ValueError or RuntimeError, from that too), so the CLI catches one class and prints one line.
Signals are not errors: `execute.Stopped` stays a KeyboardInterrupt. This module imports
nothing of servelab (the bottom layer)."""

from __future__ import annotations


class ServelabError(Exception):
    """Something servelab refused or could not do; the message is one line a user can act on."""


class UserError(ServelabError):
    """What the user asked cannot be done as asked (a params file, a missing optional dependency, a
    run folder that exists): the CLI exits 2, as for a usage error. Other ServelabErrors (an engine
    that would not start, a server that stopped answering) exit 1."""


class RunFolderExists(UserError, FileExistsError):
    """A run folder or published report is there already: runs are immutable (--force, --resume)."""


class RunFileError(UserError, ValueError):
    """A run folder's file (run.json, engine.json, a line of records.jsonl or levels.jsonl) that is not
    what servelab writes: the message names the file, the line and the first key that is wrong."""


__all__ = ["ServelabError", "UserError", "RunFolderExists", "RunFileError"]
