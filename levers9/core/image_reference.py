"""Image references as Docker reads them: `[registry/]repository[:tag][@sha256:...]`.

One parser for every side: the gateway refuses a submitted task whose image is not one (the
field named), the agent's image cache resolves it (`levers9.agent.images`). A first component
without a dot, a port or `localhost` is a Docker Hub path (`pytorch/pytorch` is
`docker.io/pytorch/pytorch`, `busybox` is `docker.io/library/busybox`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The Docker reference grammar, as distribution/reference: [host[:port]/]path[:tag][@digest].
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:(?P<host>{_HOST})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?"
)
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
"""A manifest digest, as a reference's `@...` and a worker's report carry it (fullmatch)."""


class ImageReferenceError(ValueError):
    """Not an image reference; the message quotes it and shows the form."""


@dataclass(frozen=True)
class ImageReference:
    host: str
    path: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> ImageReference:
        match = _REFERENCE.fullmatch(text) if len(text) <= 1024 else None
        if match is None:
            raise _not_a_reference(text)
        host, path = match["host"], match["path"]
        if host is None or ("." not in host and ":" not in host and host != "localhost"):
            if host is not None and not re.fullmatch(_COMPONENT, host):
                raise _not_a_reference(text)
            # Docker's rule: a first component without a dot or port is a Docker Hub path.
            path = f"{host}/{path}" if host else path
            host = "docker.io"
            if "/" not in path:
                path = f"library/{path}"
        return cls(host=host, path=path, tag=match["tag"], digest=match["digest"])

    def __str__(self) -> str:
        text = f"{self.host}/{self.path}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def at(self, digest: str) -> str:
        """`host/path@digest`: the one manifest, whatever the tag says later."""
        return f"{self.host}/{self.path}@{digest}"


def _not_a_reference(text: str) -> ImageReferenceError:
    return ImageReferenceError(
        f"{text[:200]!r} is not an image reference:"
        " [registry/]repository[:tag][@sha256:...] (a lowercase repository, e.g."
        " us-docker.pkg.dev/project/repo/image:tag)"
    )
