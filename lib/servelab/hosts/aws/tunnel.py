"""The SSM port forward to an AWS host's engine: the `aws ssm start-session` argv, and a local
port-forward process started in its own process group and ended with it. Needs the Session
Manager plugin locally; imports nothing of servelab but this package's errors."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time

from .errors import AwsHostError


def port_forward_command(region: str, instance_id: str, remote_port: int, local_port: int,
                         host: str | None = None) -> list[str]:
    """`aws ssm start-session` port forward (needs the Session Manager plugin locally)."""
    if host:
        doc = "AWS-StartPortForwardingSessionToRemoteHost"
        params = {"host": [host], "portNumber": [str(remote_port)], "localPortNumber": [str(local_port)]}
    else:
        doc = "AWS-StartPortForwardingSession"
        params = {"portNumber": [str(remote_port)], "localPortNumber": [str(local_port)]}
    return ["aws", "ssm", "start-session", "--region", region, "--target", instance_id, "--document-name", doc,
            "--parameters", json.dumps(params, separators=(",", ":"))]


def open_tunnel(cmd: list[str], local_port: int, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """Start a port-forward command in its own process group; wait until the local port listens."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AwsHostError(f"port forward exited ({proc.returncode}): "
                               f"{(proc.stderr.read() if proc.stderr else b'').decode(errors='replace')[:300]}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", local_port)) == 0:
                return proc
        time.sleep(0.5)
    close_tunnel(proc)
    raise AwsHostError(f"port forward did not open 127.0.0.1:{local_port} within {timeout_s:g} s: {shlex.join(cmd)}")


def close_tunnel(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
