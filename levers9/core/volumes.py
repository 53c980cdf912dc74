"""Workspace volumes: a workspace's bucket (`s3://BUCKET[/PREFIX]`, or `gs://` through Google's
S3 interface with an HMAC key) and its credentials, as VolumeWorkflow (`volume:<workspace>:<name>`)
keeps them (pure).

The record holds the credentials only sealed (AES-GCM under the controlplane's key, `Sealed`):
the access key id and the secret together, so neither is ever in a history, a memo, a search
attribute or a log. A credentials file is read here in the AWS shared-credentials form, and a
file that is not is refused naming the line or the field, never quoting a value.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from levers9.contract import DNS_LABEL

VOLUME_WORKFLOW = "VolumeWorkflow"
MAX_NAME_CHARS = 63
SCHEMES = ("s3", "gs")
GCS_ENDPOINT = "https://storage.googleapis.com"
"""Where a gs:// bucket is reached by the S3 protocol (an HMAC key)."""
DEFAULT_REGION = "us-east-1"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/=+@-]{1,512}")
_REGION = re.compile(r"[a-z0-9-]{1,40}")
_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?")
_SECTION = re.compile(r"\[\s*([^\]]+?)\s*\]")
KEY_ID_FIELD = "aws_access_key_id"
SECRET_FIELD = "aws_secret_access_key"


def volume_workflow_id(workspace: str, name: str) -> str:
    return f"volume:{workspace}:{name}"


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a volume (None: it can)."""
    if not name:
        return "missing: a volume is named by a DNS label, e.g. data"
    if len(name) > MAX_NAME_CHARS or not DNS_LABEL.fullmatch(name):
        return f"{name[:MAX_NAME_CHARS]!r} is not a volume name (a lowercase DNS label, e.g. data)"
    return None


class Bucket(BaseModel):
    """Where a volume's objects are: `scheme://bucket/prefix`."""

    model_config = ConfigDict(frozen=True)

    scheme: str
    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")


def parse_bucket(given: str) -> Bucket:
    """`s3://BUCKET[/PREFIX]` or `gs://BUCKET[/PREFIX]`; ValueError saying what is wrong."""
    scheme, sep, rest = given.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"{given!r}: give s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ValueError(
            f"{given!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, . and -)"
        )
    if prefix and (not _PREFIX.fullmatch(prefix) or "//" in prefix or ".." in prefix.split("/")):
        raise ValueError(f"{given!r}: the prefix {prefix!r} is not a plain object key prefix")
    return Bucket(scheme=scheme, bucket=bucket, prefix=prefix)


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot be an S3 endpoint URL ("" is AWS's, or Google's for gs://)."""
    if endpoint and not _ENDPOINT.fullmatch(endpoint):
        return f"{endpoint!r} is not an http(s)://HOST[:PORT] URL"
    return None


def region_problem(region: str) -> str | None:
    if region and not _REGION.fullmatch(region):
        return f"{region!r} is not a region (e.g. us-east-1)"
    return None


class Credentials(BaseModel):
    """A bucket's access key: what is sealed in a volume's record. Never logged or shown."""

    model_config = ConfigDict(frozen=True)

    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:  # neither value in a traceback or a log of the object
        return "Credentials(...)"

    __str__ = __repr__


class CredentialsFileError(ValueError):
    """A credentials file that cannot be read; the message names the line or field, no value."""


def parse_credentials(text: str, source: str, profile: str = "default") -> Credentials:
    """The `[profile]` key of an AWS shared-credentials file (`aws_access_key_id`,
    `aws_secret_access_key`); CredentialsFileError naming `source` and the line or field."""
    sections: dict[str, dict[str, str]] = {}
    section: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = _SECTION.fullmatch(line)
        if header is not None:
            section = header.group(1)
            sections.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or " " in key:
            raise CredentialsFileError(
                f"{source} line {number}: neither a [section] nor `key = value`"
            )
        if section is None:
            raise CredentialsFileError(
                f"{source} line {number}: {key} before any [section]: start with [{profile}]"
            )
        sections[section][key.lower()] = value.strip()
    if profile not in sections:
        found = ", ".join(f"[{name}]" for name in sections) or "none"
        raise CredentialsFileError(f"{source}: no [{profile}] section (sections: {found})")
    fields = sections[profile]
    for field in (KEY_ID_FIELD, SECRET_FIELD):
        if not fields.get(field):
            raise CredentialsFileError(f"{source}: [{profile}] has no {field}")
    if fields.get("aws_session_token"):
        raise CredentialsFileError(
            f"{source}: [{profile}] has aws_session_token: a volume needs a long-lived key"
            " (temporary credentials expire while tasks run)"
        )
    key_id, secret = fields[KEY_ID_FIELD], fields[SECRET_FIELD]
    if any(c.isspace() for c in key_id) or not key_id.isprintable():
        raise CredentialsFileError(f"{source}: [{profile}] {KEY_ID_FIELD} is not one word")
    if any(c.isspace() for c in secret) or not secret.isprintable():
        raise CredentialsFileError(f"{source}: [{profile}] {SECRET_FIELD} is not one word")
    return Credentials(access_key_id=key_id, secret_access_key=secret)


class Sealed(BaseModel):
    """Ciphertext of a volume's credentials (AES-GCM, base64), its nonce, and the generation of
    the controlplane key that sealed it."""

    model_config = ConfigDict(frozen=True)

    ciphertext: str
    nonce: str
    generation: int = Field(ge=1)


class VolumeSpec(BaseModel):
    """A volume as created: its workspace, its bucket and how to reach it (no secret)."""

    model_config = ConfigDict(frozen=True)

    name: str
    workspace: str
    bucket: str
    """s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"""
    endpoint: str = ""
    region: str = ""
    created_at: datetime | None = None


class VolumeRecord(BaseModel):
    """VolumeWorkflow's record (its memo `record`): the spec and the sealed credentials."""

    spec: VolumeSpec
    sealed: Sealed
    deleting: bool = False


def sealing_context(workspace: str, name: str) -> bytes:
    """What the ciphertext is bound to (AES-GCM's associated data): sealed credentials copied
    into another workspace's or volume's record do not open."""
    return f"levers9 volume {workspace}/{name}".encode()


def endpoint_of(spec: VolumeSpec) -> str:
    """The endpoint the bucket is reached at: the spec's, else Google's for gs://, else ""
    (AWS's, from the region)."""
    if spec.endpoint:
        return spec.endpoint
    return GCS_ENDPOINT if spec.bucket.startswith("gs://") else ""
