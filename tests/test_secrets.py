"""AWS credentials in the scrub list: from the environment always, from the profile an AWS run
uses; credentials that cannot be read stop an AWS run before anything starts (its host
refuses with the reason) while every other run goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servelab import secrets
from servelab.hosts.aws import AwsHost
from servelab.schema import load_study
from paths import ROOT

ENV_KEY, ENV_SECRET, ENV_TOKEN = "AKIAENVEXAMPLE000001", "env/Secret+Key/0000000000000001", "IQoJenvSessionToken0001"
PROFILE_KEY, PROFILE_SECRET = "AKIAPROFILEEXAMPLE01", "profile/Secret+Key/000000000001"


@pytest.fixture(autouse=True)
def clean_aws(monkeypatch, tmp_path):
    """No credentials from the machine running the tests; nothing registered by an earlier test."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
              "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(secrets, "_registered", set())


def aws_study(tmp_path: Path, profile: str | None = None):
    d = yaml.safe_load((ROOT / "params" / "seed-001-vllm-g7e.yaml").read_text())
    if profile:
        d["host"]["aws"]["profile"] = profile
    p = tmp_path / "seed-001.yaml"
    p.write_text(yaml.safe_dump(d))
    return load_study(p)


def test_env_credentials_are_scrubbed_from_a_written_file(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENV_KEY)  # not a secret-looking name, but a credential
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", ENV_TOKEN)
    f = tmp_path / "engine.log"
    f.write_text(f"key={ENV_KEY} secret={ENV_SECRET}\ntoken: {ENV_TOKEN}\n")
    assert {ENV_KEY, ENV_SECRET, ENV_TOKEN} <= set(secrets.secret_values())
    assert secrets.scrub_file(f) is True
    assert f.read_text() == "key=*** secret=***\ntoken: ***\n"
    assert set(secrets.aws_secret_values()) == {ENV_KEY, ENV_SECRET, ENV_TOKEN}


def test_profile_credentials_are_scrubbed(monkeypatch, tmp_path):
    creds, config = tmp_path / "credentials", tmp_path / "config"
    creds.write_text(f"[bench]\naws_access_key_id = {PROFILE_KEY}\naws_secret_access_key = {PROFILE_SECRET}\n")
    config.write_text("[profile bench]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert PROFILE_SECRET not in secrets.secret_values()  # a named profile is not the default session's
    AwsHost(aws_study(tmp_path, profile="bench"), "aws-ecs").check()  # what an AWS run does before anything
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(f'{{"note": "{PROFILE_KEY}:{PROFILE_SECRET}"}}')
    assert secrets.scrub_tree(out) == [out / "run.json"]
    assert (out / "run.json").read_text() == '{"note": "***:***"}'


def test_unreadable_credentials_file_stops_an_aws_run_with_the_reason(monkeypatch, tmp_path):
    bad = tmp_path / "credentials"
    bad.write_text(f"[default\naws_access_key_id = {PROFILE_KEY}\n")  # no closing bracket: unparsable
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(bad))
    host = AwsHost(aws_study(tmp_path), "aws-ecs")
    with pytest.raises(secrets.AwsCredentialsError) as e:
        host.check()
    msg = str(e.value)
    assert msg.startswith("AWS credentials of the default AWS profile / environment cannot be read "
                          f"(ConfigParseError: Unable to parse config file: {bad}): an AWS run stops before anything "
                          "starts, as they could not be scrubbed; fix the file or the AWS_* variables")
    assert isinstance(e.value, ValueError)  # servelab's CLI prints it in one line, exit 1
    # a non-AWS run keeps working: the scrub list is simply without them
    assert secrets.scrub("no secret here") == "no secret here"


def test_aws_variables_without_credentials_stop_an_aws_run(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENV_KEY)  # the secret key is missing
    with pytest.raises(secrets.AwsCredentialsError, match="PartialCredentialsError"):
        AwsHost(aws_study(tmp_path), "aws-ecs").check()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(secrets.AwsCredentialsError, match="no AWS credentials resolve for the default AWS profile"):
        AwsHost(aws_study(tmp_path), "aws-ecs").check()
    with pytest.raises(secrets.AwsCredentialsError, match="profile 'nope' cannot be read \\(ProfileNotFound"):
        secrets.aws_secret_values("nope")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENV_KEY)
    assert ENV_KEY in secrets.secret_values()  # a non-AWS run: no error, the variable is still scrubbed
