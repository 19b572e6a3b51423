"""Which stack and which boto3 session: `StackParams`, the injectable session factory
(`region -> boto3.Session`; moto sessions in tests) and `open_session`, which turns missing
credentials into `NoCredentials`. The bottom of the AWS package beside `errors`; it imports no
other servelab module, and boto3 only when a session is made."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import NoCredentials

SessionFactory = Callable[[str], Any]


@dataclass(frozen=True)
class StackParams:
    """Which stack: `stack_name` in `region`, template `parameters` ({name: str | list}), `profile`."""
    stack_name: str
    region: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    profile: str | None = None


def default_session_factory(profile: str | None = None) -> SessionFactory:
    """`boto3.Session(profile_name=profile, region_name=region)` per call; raises ProfileNotFound."""
    import boto3  # imported when a session is made: servelab.hosts loads without boto3 (the GPU device's image)

    return lambda region: boto3.Session(profile_name=profile, region_name=region)


def open_session(params: StackParams, session_factory: SessionFactory | None) -> Any:
    """A session with credentials; raises NoCredentials (missing keys, unknown profile) instead."""
    from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError, ProfileNotFound

    factory = session_factory or default_session_factory(params.profile)
    try:
        session = factory(params.region)
        credentials = session.get_credentials()
    except (NoCredentialsError, PartialCredentialsError, NoRegionError, ProfileNotFound) as e:
        raise NoCredentials(f"AWS credentials unusable: {e}") from e
    if credentials is None:
        raise NoCredentials(f"no AWS credentials for region {params.region}"
                            + (f" and profile {params.profile}" if params.profile else "")
                            + " (set AWS_PROFILE or run aws configure / aws sso login)")
    return session
