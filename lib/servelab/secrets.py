"""Keep secrets out of every artifact.

API keys and cloud credentials reach servelab only through the environment (or an AWS
profile); params files may name an environment variable but never hold a value. Before any
artifact is written (records, run.json, logs copied into reports, executed notebooks, HTML)
its text passes through `scrub`, which replaces the value of every secret-looking
environment variable and of the AWS credentials with `***`: the AWS_* key variables always,
the default session's credentials when they can be read, and those of the profile an AWS run
uses (`aws_secret_values`, which AwsHost calls before anything starts and which refuses the
run with `AwsCredentialsError` when they cannot be read). Not a vault: it stores nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import ServelabError

# Names that END in a secret word ("VLLM_API_KEY", "HF_TOKEN", "hf-token"); plurals such as
# "max-num-batched-tokens" are counts, not secrets.
SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?|ACCESS_KEY|SESSION_KEY)$", re.I)
SECRET_FLAG = re.compile(r"(?:^|[-_])(api[-_]?key|token|secret|password|credentials?)$", re.I)
SECRET_HEADER = re.compile(r"^(authorization|x-api-key|api-key|proxy-authorization)$", re.I)
MIN_LEN = 6
MASK = "***"
# AWS's own credential variables; AWS_ACCESS_KEY_ID does not end in a secret word but is one
AWS_ENV_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_registered: set[str] = set()  # credentials read by aws_secret_values in this process


class AwsCredentialsError(ServelabError, ValueError):
    """The AWS credentials of an AWS run cannot be read, so they could not be kept out of the
    artifacts either: the run stops before anything starts."""


def secret_values() -> list[str]:
    """Values of secret-looking environment variables (and AWS credentials), longest first."""
    vals = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_LEN}
    vals |= _aws_credentials()
    return sorted(vals, key=len, reverse=True)


def _aws_env() -> set[str]:
    return {v for k in AWS_ENV_CREDENTIALS if len(v := os.environ.get(k, "")) >= MIN_LEN}


def _read_aws(profile: str | None) -> set[str] | None:
    """The session's credentials (None when none resolve); raises what boto3/botocore raise."""
    import boto3

    c = boto3.Session(profile_name=profile).get_credentials()
    if c is None:
        return None
    f = c.get_frozen_credentials()
    return {v for v in (f.access_key, f.secret_key, f.token) if v and len(v) >= MIN_LEN}


def _aws_credentials() -> set[str]:
    """AWS credentials for the scrub list of any run: the AWS_* variables, what an AWS run read,
    and the default session's when readable (a non-AWS run goes on without them)."""
    vals = _aws_env() | _registered
    if not any(k.startswith("AWS_") for k in os.environ) and not Path("~/.aws").expanduser().exists():
        return vals
    try:
        vals |= _read_aws(None) or set()
    except Exception:  # noqa: BLE001 - not an AWS run: aws_secret_values is where this is an error
        pass
    return vals


def aws_secret_values(profile: str | None = None) -> list[str]:
    """The AWS credentials an AWS run uses (environment and `profile`), added to every later
    scrub in this process; longest first. Raises AwsCredentialsError, saying what to fix, when
    boto3 cannot read them (a broken credentials/config file, an unknown profile) or when none
    resolve (AWS_* variables set but incomplete, no profile, no SSO login)."""
    where = f"profile {profile!r}" if profile else "the default AWS profile / environment"
    files = ", ".join(f"{k}={os.environ[k]}" for k in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
                      if os.environ.get(k))
    hint = ("fix the file or the AWS_* variables (aws configure, aws sso login)"
            + (f"; files: {files}" if files else ""))
    try:
        got = _read_aws(profile)
    except Exception as e:  # noqa: BLE001 - ProfileNotFound, ConfigParseError, PartialCredentialsError, ...
        raise AwsCredentialsError(f"AWS credentials of {where} cannot be read ({type(e).__name__}: {e}): an AWS "
                                  f"run stops before anything starts, as they could not be scrubbed; {hint}") from e
    if not got:
        set_vars = [k for k in (*AWS_ENV_CREDENTIALS, "AWS_PROFILE") if os.environ.get(k)]
        raise AwsCredentialsError(f"no AWS credentials resolve for {where}"
                                  + (f" although {', '.join(set_vars)} are set" if set_vars else "")
                                  + f": an AWS run stops before anything starts; {hint}")
    vals = _aws_env() | got
    _registered.update(vals)
    return sorted(vals, key=len, reverse=True)


def scrub(text: str, values: list[str] | None = None) -> str:
    for v in values if values is not None else secret_values():
        if v in text:
            text = text.replace(v, MASK)
    return text


def scrub_file(path: Path, values: list[str] | None = None) -> bool:
    """Rewrite a text file with secrets masked; returns True if anything was replaced."""
    p = Path(path)
    try:
        txt = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = scrub(txt, values)
    if clean != txt:
        p.write_text(clean, encoding="utf-8")
        return True
    return False


def scrub_tree(root: Path) -> list[Path]:
    """Scrub every text file under root; returns the files that held a secret."""
    values = secret_values()
    if not values:
        return []
    return [p for p in Path(root).rglob("*") if p.is_file() and scrub_file(p, values)]
