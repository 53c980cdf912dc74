"""A kubeconfig for kubectl against the sandbox: the server, its CA, a bearer-token user."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml


def kubeconfig(
    *,
    server: str,
    ca_pem: bytes,
    token: str,
    cluster: str = "levers9-sandbox",
    user: str = "levers9-admin",
    namespace: str | None = None,
) -> dict[str, Any]:
    """The kubeconfig document (one cluster, one user, one current context)."""
    context: dict[str, Any] = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": context}],
        "current-context": cluster,
        "preferences": {},
    }


def write_kubeconfig(path: Path, **kwargs: Any) -> Path:
    """Writes `kubeconfig(**kwargs)` to `path`, readable only by its owner (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(kubeconfig(**kwargs), sort_keys=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path
