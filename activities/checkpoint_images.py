"""Checkpoint images in a workspace's checkpoint volume, as the controlplane removes them
(`box delete`): every object under `<prefix>/checkpoints/<name>/` (the agent's `image.tar` and
`image.tar.sha256`, levers9.agent.checkpoints.upload), listed and deleted with the volume's own
credentials, unsealed for that call alone. An error names S3's code, never a credential."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from levers9.contract import CHECKPOINT_STORE_FOLDER
from levers9.core.volumes import DEFAULT_REGION, parse_bucket
from levers9.proto import worker_pb2

TIMEOUT_S = 30.0


class StoreError(RuntimeError):
    """The volume could not be listed or written: S3's code, the volume named."""


def stored_prefix(bucket: str, name: str) -> tuple[str, str]:
    """(bucket, key prefix) of checkpoint `name` in a volume whose bucket is `bucket`
    (s3://BUCKET[/PREFIX])."""
    parsed = parse_bucket(bucket)
    folder = "/".join(p for p in (parsed.prefix, CHECKPOINT_STORE_FOLDER, name) if p)
    return parsed.bucket, f"{folder}/"


def delete_stored(access: worker_pb2.VolumeAccess, name: str) -> int:
    """Deletes every object of checkpoint `name` in the volume; how many there were."""
    bucket, prefix = stored_prefix(access.bucket, name)
    client: Any = boto3.session.Session().client(
        "s3",
        endpoint_url=access.endpoint or None,
        region_name=access.region or DEFAULT_REGION,
        aws_access_key_id=access.access_key_id or None,
        aws_secret_access_key=access.secret_access_key or None,
        config=Config(
            connect_timeout=TIMEOUT_S,
            read_timeout=TIMEOUT_S,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path" if access.endpoint else "auto"},
        ),
    )
    deleted = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                deleted += len(keys)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "") or "error")
        raise StoreError(f"volume {access.name}: {code} on s3://{bucket}/{prefix}") from None
    except BotoCoreError as exc:
        raise StoreError(
            f"volume {access.name}: its endpoint did not answer ({type(exc).__name__})"
        ) from None
    finally:
        client.close()
    return deleted
