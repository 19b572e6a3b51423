"""Host registry: one `Host` class per `host.kind` (local, attach, aws-ecs, aws-instance).

`HOSTS` maps each of the schema's `HOST_KINDS` (the one list of kinds) to its class; `get(kind)`
returns the class (whose `cost_basis` a report reads without building a host) and
`for_study(study)` makes the study's host, once per study run (the pipeline shares it).
Everything host-specific (what provisioning prepares, how the engine is started or reached,
stopped and torn down, what a dry run says, what guards the run) lives in `hosts/<kind>.py` and
the `hosts/aws/` package."""

from __future__ import annotations

from ..schema import HOST_KINDS, Study
from .attach import AttachHost
from .aws import AwsHost
from .base import Host, Server
from .local import LocalHost
from .process import EngineError

HOSTS: dict[str, type[Host]] = {kind: cls for cls in (LocalHost, AttachHost, AwsHost) for kind in cls.kinds}
if tuple(HOSTS) != HOST_KINDS:  # the schema's list is the one list of kinds
    raise ImportError(f"hosts registry {tuple(HOSTS)} differs from schema HOST_KINDS {HOST_KINDS}")
KINDS = HOST_KINDS


def get(kind: str) -> type[Host]:
    """The host class of `host.kind`; ValueError naming the known kinds otherwise."""
    try:
        return HOSTS[kind]
    except KeyError:
        raise ValueError(f"unknown host kind {kind!r}; expected one of {list(HOSTS)}") from None


def for_study(study: Study) -> Host:
    """The study's host (stateful for AWS: make it once per run and hand it on)."""
    return get(study.host.kind)(study)


def with_url(study: Study, url: str) -> Study:
    """The study with its server URL replaced (servelab run --url); only an attach study has one."""
    if not issubclass(get(study.host.kind), AttachHost):
        raise ValueError(f"--url needs host.kind: attach (this study's host is {study.host.kind})")
    return AttachHost.with_url(study, url)


__all__ = ["Host", "Server", "EngineError", "HOSTS", "KINDS", "get", "for_study", "with_url", "LocalHost",
           "AttachHost", "AwsHost"]
