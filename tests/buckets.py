"""An S3 that checks credentials, for volumes' tests: moto's server started with
`INITIAL_NO_AUTH_ACTION_COUNT` so that only its first few calls (which make an IAM user with
an S3 policy, one without, one that may only list and read, and their keys) go unchecked;
every later call is signed with a key moto knows, or refused as S3 refuses it
(InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from levers9.core.volumes import Credentials
from sandbox import aws

_UNCHECKED_CALLS = 8
"""create_user, create_access_key, put_user_policy for `allowed` and `reader`; the same less the
policy for `denied`."""
_S3_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}
_S3_READ = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetObject"], "Resource": "*"}
    ],
}


@dataclass(frozen=True)
class CheckingS3:
    endpoint: str
    allowed: Credentials
    """A key whose user may do anything in S3."""
    denied: Credentials
    """A key moto knows whose user may do nothing."""
    reader: Credentials
    """A key whose user may list and read, not write: a mount checks, an upload is refused."""

    def client(self, credentials: Credentials | None = None) -> Any:
        key = credentials or self.allowed
        return boto3.session.Session(
            aws_access_key_id=key.access_key_id,
            aws_secret_access_key=key.secret_access_key,
            region_name=aws.REGION,
        ).client("s3", endpoint_url=self.endpoint)


def _user(iam: Any, name: str, policy: dict[str, Any] | None) -> Credentials:
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    if policy is not None:
        iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
    return Credentials(access_key_id=key["AccessKeyId"], secret_access_key=key["SecretAccessKey"])


@contextmanager
def checking_s3(log: Path) -> Iterator[CheckingS3]:
    before = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(_UNCHECKED_CALLS)
    try:
        server = aws.LocalMoto(log).start()
    finally:
        if before is None:
            del os.environ["INITIAL_NO_AUTH_ACTION_COUNT"]
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = before
    try:
        iam = boto3.session.Session(
            aws_access_key_id=aws.ACCESS_KEY_ID,
            aws_secret_access_key=aws.SECRET_ACCESS_KEY,
            region_name=aws.REGION,
        ).client("iam", endpoint_url=server.endpoint)
        allowed = _user(iam, "levers9-team", _S3_ALL)
        denied = _user(iam, "levers9-nobody", None)
        reader = _user(iam, "levers9-reader", _S3_READ)
        yield CheckingS3(server.endpoint, allowed, denied, reader)
    finally:
        server.stop()
