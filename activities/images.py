"""Copy the worker image from the controlplane's ECR into the cluster's project registry with
`skopeo copy` (GKE nodes cannot pull from ECR: spec, "What has to be true").

Credentials: a pull token for ECR from boto3, a push token for Artifact Registry from
google-auth (`oauth2accesstoken`). They go to skopeo in an auth file (0600, in a private
temporary directory, removed after), never on its command line, in a log or in history.

Registry mirrors (`LEVERS9_REGISTRY_MIRRORS`) say where an image's registry host really
answers (the sandbox's loopback registries); TLS is off only for the hosts in
`LEVERS9_INSECURE_REGISTRIES`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import google.auth
import google.auth.transport.requests
from botocore.exceptions import BotoCoreError, ClientError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.aws import AwsActivities, aws_error, ecr_login
from levers9.logs import get_logger
from levers9.process import run_command
from levers9.providers.gke import CopiedImage, CopyImageInput
from levers9.telemetry import span

SKOPEO_TIMEOUT_S = 900.0
GCP_USER = "oauth2accesstoken"

log = get_logger(__name__)


@dataclass(frozen=True)
class ImageRef:
    host: str
    path: str
    tag: str

    @classmethod
    def parse(cls, reference: str) -> ImageRef:
        name, _, tag = reference.rpartition(":")
        if not name or "/" in tag:
            name, tag = reference, "latest"
        host, _, path = name.partition("/")
        if not path or ("." not in host and ":" not in host and host != "localhost"):
            raise ValueError(f"image {reference!r} has no registry host (host/path:tag)")
        return cls(host, path, tag)

    def on(self, host: str) -> str:
        return f"{host}/{self.path}:{self.tag}"


def _gcp_token() -> str:
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    credentials.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]
    token: str = str(credentials.token)
    return token


class ImageActivities:
    def __init__(
        self,
        mirrors: Mapping[str, str],
        insecure: frozenset[str],
        aws: AwsActivities,
        gcp_token: Callable[[], str] = _gcp_token,
    ) -> None:
        self._mirrors = dict(mirrors)
        self._insecure = insecure
        self._aws = aws
        self._gcp_token = gcp_token

    def _where(self, reference: str) -> tuple[str, str]:
        """(the reference skopeo dials, the host it dials)."""
        ref = ImageRef.parse(reference)
        host = self._mirrors.get(ref.host, ref.host)
        return ref.on(host), host

    @activity.defn
    async def copy_image(self, input: CopyImageInput) -> CopiedImage:
        if shutil.which("skopeo") is None:
            raise ApplicationError(
                "skopeo is not installed on this controlplane: apt-get install skopeo",
                type="NoSkopeo",
                non_retryable=True,
            )
        try:
            source, source_host = self._where(input.source)
            destination, destination_host = self._where(input.destination)
        except ValueError as exc:
            raise ApplicationError(str(exc), non_retryable=True) from None
        try:
            user, password = await asyncio.to_thread(ecr_login, self._aws.ecr())
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, "ECR pull token") from None
        try:
            token = await asyncio.to_thread(self._gcp_token)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise ApplicationError(
                f"Artifact Registry push token: {type(exc).__name__}; run"
                " `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS",
                non_retryable=True,
            ) from None
        auths = {
            source_host: _auth(user, password),
            destination_host: _auth(GCP_USER, token),
        }
        with tempfile.TemporaryDirectory(prefix="levers9-skopeo-") as scratch:
            authfile = Path(scratch) / "auth.json"
            authfile.touch(mode=0o600)
            authfile.write_text(json.dumps({"auths": auths}))
            tls = str(destination_host not in self._insecure).lower()
            inspect = [
                *("inspect", "--authfile", str(authfile), f"--tls-verify={tls}"),
                *("--format", "{{.Digest}}", f"docker://{destination}"),
            ]
            try:
                previous = (await self._skopeo(*inspect)).strip()
            except ApplicationError:
                previous = ""  # not there yet
            await self._skopeo(
                "copy",
                "--authfile",
                str(authfile),
                f"--src-tls-verify={str(source_host not in self._insecure).lower()}",
                f"--dest-tls-verify={str(destination_host not in self._insecure).lower()}",
                "--retry-times",
                "2",
                f"docker://{source}",
                f"docker://{destination}",
            )
            digest = (await self._skopeo(*inspect)).strip()
        log.info("worker image copied", destination=input.destination, digest=digest)
        return CopiedImage(destination=input.destination, digest=digest, previous_digest=previous)

    async def _skopeo(self, *args: str) -> str:
        with span(f"skopeo {args[0]}"):
            return await self._run_skopeo(*args)

    async def _run_skopeo(self, *args: str) -> str:
        try:  # in a thread, spawned by CPython (levers9.process.run_command says why)
            done = await run_command(("skopeo", *args), SKOPEO_TIMEOUT_S)
        except TimeoutError:
            raise ApplicationError(f"skopeo {args[0]} took over {SKOPEO_TIMEOUT_S:.0f}s") from None
        out, err = done.stdout, done.stderr
        if done.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            detail = message[-1] if message else f"exit {done.returncode}"
            permanent = any(w in detail for w in ("unauthorized", "denied", "manifest unknown"))
            fix = (
                "; check that the image exists in the controlplane's registry and the"
                " credentials may read it / push to the project's registry"
                if permanent
                else ""
            )
            raise ApplicationError(
                f"skopeo {args[0]}: {detail}{fix}", type="SkopeoFailed", non_retryable=permanent
            )
        return out.decode()


def _auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
