"""The AWS hosts (`host.kind` aws-ecs and aws-instance) and the ECS GPU stack, one job
per module; each imports only the ones listed before it:

- `errors`: every AWS error (`AwsHostError`, `StackError` and their kinds);
- `session`: which stack (`StackParams`) and the injectable boto3 session factory;
- `billing`: fixed prices, the template read without AWS, what bills now;
- `stack`: the CloudFormation stack (plan, up, change set, status, down, logs, tunnel);
- `deadline`: the Auto Scaling deadline AWS enforces itself, and `start`;
- `base`: what both boto3 hosts share (guards, watchdog, region loop); `tunnel`: the SSM port forward;
- `plan`: what `--dry-run` says, without calling AWS;
- `ecs` / `instance`: the two boto3 hosts;
- `host`: `AwsHost`, the pipeline's `Host` for both kinds.

`servelab aws ...` (cli_aws.py) is the command-line face of `stack` and `deadline`. Importing the
package needs no boto3 (the GPU device's image has none): `stack` and `deadline` (botocore at
their top) are imported where they are called, and boto3 when a session is made."""

from __future__ import annotations

from .base import BotoHost, HostInfo
from .billing import Billable, CostItem
from .ecs import EcsServiceHost
from .errors import (AccountMismatch, AwsHostError, CapacityUnavailable, GuardTripped, HostTimeout, Leftovers,
                     NoCredentials, NotDeployed, RegionCapacity, SharedCapacity, StackError, StackFailed, StackNotFound)
from .host import AWS_CLASSES, AwsHost, engine_command, engine_commands, make_host
from .instance import SingleInstanceHost
from .session import SessionFactory, StackParams, default_session_factory

__all__ = ["AWS_CLASSES", "AccountMismatch", "AwsHost", "AwsHostError", "Billable", "BotoHost", "CapacityUnavailable",
           "CostItem", "EcsServiceHost", "GuardTripped", "HostInfo", "HostTimeout", "Leftovers", "NoCredentials",
           "NotDeployed", "RegionCapacity", "SessionFactory", "SharedCapacity", "SingleInstanceHost", "StackError",
           "StackFailed", "StackNotFound", "StackParams", "default_session_factory", "engine_command",
           "engine_commands", "make_host"]
