"""Processes the test session started that are still alive after it: engines, Ray clusters and
actors, reference servers, Chromium. A test helper (conftest.py calls it at session start and
end); the library never imports it.

Every process the session starts inherits its environment, so the session marks it with a
token (`SERVELAB_TEST_SESSION`): a Ray actor re-parented to init, a vLLM server started by a
fixture or a Chromium left by playwright still carries it, while the servers and clusters of
other sessions on the same machine do not (they are never counted, never killed). Children of
the pytest process are counted whatever their environment."""

from __future__ import annotations

import os
import time
import uuid

import psutil

ENV = "SERVELAB_TEST_SESSION"
GRACE_S = 10.0  # a process is given this long to exit after the session's teardown
# helpers of the interpreter itself: they exit with pytest, after this check
INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def mark_session() -> str:
    """Set a new session token in this process's environment (inherited by everything it
    starts; a pytest run inside a test gets its own)."""
    token = uuid.uuid4().hex
    os.environ[ENV] = token
    return token


def _carries(p: psutil.Process, token: str) -> bool:
    try:
        return p.environ().get(ENV) == token
    except (psutil.Error, OSError):
        return False


def started_by_session(token: str, before: set[int] | None = None) -> list[psutil.Process]:
    """Alive processes (not zombies) that descend from this one or carry `token`, other than
    this process itself and the pids in `before` (alive when the session began)."""
    me = psutil.Process()
    found = {c.pid: c for c in me.children(recursive=True)}
    for p in psutil.process_iter():
        if p.pid not in found and p.pid != me.pid and _carries(p, token):
            found[p.pid] = p
    out = []
    for pid, p in sorted(found.items()):
        if before and pid in before:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not any(h in " ".join(p.cmdline()) for h in INTERPRETER_HELPERS):
                out.append(p)
        except psutil.Error:
            pass
    return out


def describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline()) or p.name()
        return f"pid {p.pid} (ppid {p.ppid()}): {cmd[:300]}"
    except psutil.Error:
        return f"pid {p.pid}: (gone)"


def leftovers(token: str, before: set[int] | None = None, grace_s: float = GRACE_S) -> list[str]:
    """The session's processes still alive after `grace_s` (described with their command
    lines); each is then killed so that one failing session does not load the machine for
    the next."""
    deadline = time.monotonic() + grace_s
    alive = started_by_session(token, before)
    while alive and time.monotonic() < deadline:
        time.sleep(0.25)
        alive = started_by_session(token, before)
    lines = [describe(p) for p in alive]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return lines
