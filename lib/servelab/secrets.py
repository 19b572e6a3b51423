"""Keep secrets out of every artifact.

API keys and cloud credentials reach servelab only through the environment (or an AWS
profile); params files may name an environment variable but never hold a value. Before any
artifact is written (records, run.json, logs copied into reports, executed notebooks, HTML)
its text passes through `scrub`, which replaces the value of every secret-looking
environment variable and of the AWS session's credentials with `***`. Not a vault: it
stores nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# Names that END in a secret word ("VLLM_API_KEY", "HF_TOKEN", "hf-token"); plurals such as
# "max-num-batched-tokens" are counts, not secrets.
SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?|ACCESS_KEY|SESSION_KEY)$", re.I)
SECRET_FLAG = re.compile(r"(?:^|[-_])(api[-_]?key|token|secret|password|credentials?)$", re.I)
SECRET_HEADER = re.compile(r"^(authorization|x-api-key|api-key|proxy-authorization)$", re.I)
MIN_LEN = 6
MASK = "***"


def secret_values() -> list[str]:
    """Values of secret-looking environment variables (and AWS credentials), longest first."""
    vals = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= MIN_LEN}
    vals |= _aws_credentials()
    return sorted(vals, key=len, reverse=True)


def _aws_credentials() -> set[str]:
    if not any(k.startswith("AWS_") for k in os.environ) and not Path("~/.aws").expanduser().exists():
        return set()
    try:
        import boto3

        c = boto3.Session().get_credentials()
    except Exception:
        return set()
    if c is None:
        return set()
    return {v for v in (c.access_key, c.secret_key, c.token) if v and len(v) >= MIN_LEN}


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
