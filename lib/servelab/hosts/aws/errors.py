"""Every error of the AWS hosts and the stack, in one place at the bottom of the package (so
that each module above can raise and catch them without importing its peers).

`AwsHostError` is what the pipeline's hosts raise (start, watch, stop), `StackError` what the
stack operations raise (`servelab aws ...`); both derive from `servelab.errors.ServelabError`."""

from __future__ import annotations

from typing import Any

from ...errors import ServelabError


class AwsHostError(ServelabError, RuntimeError):
    """An AWS host could not be started, watched or stopped; the message says what and where."""


class AccountMismatch(AwsHostError):
    pass


class CapacityUnavailable(AwsHostError):
    """No region of the list had capacity; `attempts` holds (region, reason) pairs."""

    def __init__(self, attempts: list[tuple[str, str]]) -> None:
        self.attempts = attempts
        super().__init__("no GPU capacity in any region: " + "; ".join(f"{r}: {why}" for r, why in attempts))


class GuardTripped(AwsHostError):
    """The spend or time limit was reached; the host has been stopped."""


class HostTimeout(AwsHostError):
    pass


class RegionCapacity(AwsHostError):
    """This region has no capacity now: the region loop tears down and tries the next one."""


class NotDeployed(AwsHostError):
    """The host's resources do not exist in this region: the region loop tries the next one."""


class StackError(ServelabError, RuntimeError):
    """A stack operation failed; the message is one line a user can act on."""


class NoCredentials(StackError):
    """No usable AWS credentials (or region) for the session."""


class StackNotFound(StackError):
    """The named stack does not exist in the region."""


class StackFailed(StackError):
    """Create/update failed; `events` holds the failed resource events, `leftovers` what stayed
    (billing.Billable items)."""

    def __init__(self, message: str, events: list[str], leftovers: list[Any]):
        super().__init__(message)
        self.events, self.leftovers = events, leftovers


class SharedCapacity(StackError):
    """Another ECS service still uses the stack's capacity provider; `services` names them."""

    def __init__(self, message: str, services: list[str]):
        super().__init__(message)
        self.services = services


class Leftovers(StackError):
    """Billable resources survived `down`; `items` lists them (billing.Billable) with their hourly USD."""

    def __init__(self, message: str, items: list[Any]):
        super().__init__(message)
        self.items = items
