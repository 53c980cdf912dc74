"""The dev stack's buckets: moto's S3 (the same server as the controlplane's AWS) holds one bucket
per dev workspace (`levers9-<workspace>`; `dev up` makes `levers9-default`), so that workspace
volumes work on a laptop, and a credentials file in the AWS shared-credentials form with moto's
test keys (never a real credential) for `levers9 volume create ... --credentials-file`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3

from levers9.files import write_private
from sandbox.aws import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY

DEV_WORKSPACES = ("default",)
CREDENTIALS_FILE = "moto-credentials"


def bucket_name(workspace: str) -> str:
    return f"levers9-{workspace}"


def s3_client(endpoint: str) -> Any:
    session = boto3.Session(
        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY, region_name=REGION
    )
    return session.client("s3", endpoint_url=endpoint.rstrip("/"))


def ensure_buckets(endpoint: str, workspaces: tuple[str, ...] = DEV_WORKSPACES) -> list[str]:
    """Each workspace's bucket on moto (made when missing); their names."""
    client = s3_client(endpoint)
    have = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    names = [bucket_name(w) for w in workspaces]
    for name in names:
        if name not in have:
            client.create_bucket(Bucket=name)
    return names


def write_credentials(path: Path) -> Path:
    """moto's test keys as an AWS shared-credentials file (mode 0600)."""
    write_private(
        path,
        f"[default]\naws_access_key_id = {ACCESS_KEY_ID}\n"
        f"aws_secret_access_key = {SECRET_ACCESS_KEY}\nregion = {REGION}\n",
    )
    return path


def volume_hint(endpoint: str, bucket: str, credentials: Path) -> str:
    """The command that makes a volume of a dev bucket."""
    return (
        f"levers9 volume create data --bucket s3://{bucket} --endpoint {endpoint.rstrip('/')}"
        f" --credentials-file {credentials}"
    )
