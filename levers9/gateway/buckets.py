"""Whether a volume's bucket answers its credentials: one ListObjectsV2 (at most one key, under its
prefix) from the controlplane, as `levers9 volume create` asks before it records the volume. A
refusal is S3's error code (AccessDenied, NoSuchBucket, InvalidAccessKeyId,
SignatureDoesNotMatch) or the endpoint that did not answer: never S3's message or any part of
the credentials.
"""

from __future__ import annotations

import asyncio
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from levers9.core.volumes import DEFAULT_REGION, Credentials, VolumeSpec, endpoint_of, parse_bucket

CHECK_TIMEOUT_S = 10.0
# HEAD answers carry no body: botocore names their error by the status alone.
_BY_STATUS = {"403": "AccessDenied", "404": "NoSuchBucket", "301": "PermanentRedirect"}


def _list_one(spec: VolumeSpec, credentials: Credentials) -> str | None:
    bucket = parse_bucket(spec.bucket)
    endpoint = endpoint_of(spec)
    client: Any = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint or None,
        region_name=spec.region or DEFAULT_REGION,
        aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key,
        config=Config(
            connect_timeout=5,
            read_timeout=CHECK_TIMEOUT_S,
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path" if endpoint else "auto"},
        ),
    )
    where = endpoint or "AWS"
    try:
        client.list_objects_v2(
            Bucket=bucket.bucket, MaxKeys=1, Prefix=f"{bucket.prefix}/" if bucket.prefix else ""
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "") or "error")
        code = _BY_STATUS.get(code, code)
        return f"{code} on {spec.bucket} (listed at {where} with the given credentials)"
    except BotoCoreError as exc:
        return f"{spec.bucket}: {where} did not answer ({type(exc).__name__})"
    return None


async def bucket_problem(spec: VolumeSpec, credentials: Credentials) -> str | None:
    """Why the volume's bucket cannot be listed with `credentials` (S3's error code, or the
    endpoint unreachable); None when it can."""
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(_list_one, spec, credentials), CHECK_TIMEOUT_S * 2
        )
    except TimeoutError:
        where = endpoint_of(spec) or "AWS"
        return f"{spec.bucket}: {where} did not answer within {CHECK_TIMEOUT_S * 2:.0f} s"
