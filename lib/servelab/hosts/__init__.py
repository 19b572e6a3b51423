"""Host registry: one `Host` class per `host.kind` (local, attach, aws-ecs, aws-instance).

`for_study(study)` makes the study's host; everything host-specific (what provisioning
prepares, how the engine is started or reached, stopped and torn down, what a dry run says,
what guards the run) lives in `hosts/<kind>.py`."""

from __future__ import annotations

from ..schema import Study
from .attach import AttachHost
from .aws import AwsHost
from .base import Host, Server
from .local import LocalHost
from .process import EngineError

KINDS = ("local", "attach", "aws-ecs", "aws-instance")


def with_url(study: Study, url: str) -> Study:
    """The study with its server URL replaced (servelab run --url); only an attach study has one."""
    if not isinstance(for_study(study), AttachHost):
        raise ValueError(f"--url needs host.kind: attach (this study's host is {study.host.kind})")
    return AttachHost.with_url(study, url)


def for_study(study: Study) -> Host:
    kind = study.host.kind
    if kind == "local":
        return LocalHost(study)
    if kind == "attach":
        return AttachHost(study)
    return AwsHost(study, kind)


__all__ = ["Host", "Server", "EngineError", "for_study", "with_url", "KINDS", "LocalHost", "AttachHost", "AwsHost"]
