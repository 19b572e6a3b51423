"""The session's leftover-process check (tests/leftovers.py): a process the session started
is found after it was re-parented to init, with its command line, and killed; another
session's process is not touched."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import leftovers
import psutil


def _orphan(env: dict[str, str], tag: str) -> int:
    """A `sleep` whose parent exited at once (re-parented to init, as a lost Ray actor is)."""
    out = subprocess.run(["bash", "-c", f"exec -a sleep-{tag} sleep 60 >/dev/null 2>&1 & echo $!"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def test_orphan_with_the_token_is_found_listed_and_killed():
    token = uuid.uuid4().hex
    ours = _orphan({**os.environ, leftovers.ENV: token}, "ours")
    theirs = _orphan({**os.environ, leftovers.ENV: "another-session"}, "theirs")
    try:
        assert psutil.Process(ours).ppid() != os.getpid()  # not a child: found by its token alone
        t0 = time.monotonic()
        # children this session started before the test (the session's vLLM engine) are not leftovers yet
        mine_already = {c.pid for c in psutil.Process().children(recursive=True)}
        lines = leftovers.leftovers(token, before=mine_already, grace_s=0.5)
        assert time.monotonic() - t0 >= 0.5  # it was given its grace period to exit
        assert len(lines) == 1 and f"pid {ours} " in lines[0] and "sleep-ours" in lines[0]
        deadline = time.monotonic() + 5
        while psutil.pid_exists(ours) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(ours)  # killed (init reaps it)
        assert psutil.Process(theirs).is_running()  # another session's process is left alone
    finally:
        for pid in (ours, theirs):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_process_that_exits_within_the_grace_period_is_not_a_leftover():
    token = uuid.uuid4().hex
    # the session's own engines (children started before this test) are not this test's business
    mine_already = {c.pid for c in psutil.Process().children(recursive=True)}
    p = subprocess.Popen(["sleep", "0.3"], env={**os.environ, leftovers.ENV: token})
    try:
        assert leftovers.leftovers(token, before=mine_already, grace_s=5.0) == []
    finally:
        p.wait()
