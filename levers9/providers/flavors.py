"""What each `kubernetes.flavor` means to the controlplane (pure): how its credentials are checked
when values load, whether the cluster's CA must be given, and whether its GPU nodes carry the
`nvidia.com/gpu` taint that the worker Job must tolerate. `FLAVORS` is the registry; a new flavor
(an EKS or AKS node pool) is one more `FlavorRules` here, plus its API client
(activities/kube_clients.py) and, if it needs one, a way to make the pool (docs/architecture.md,
"A new provider touches").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

Flavor = Literal["gke", "generic"]
"""How the controlplane reaches a `provider: kubernetes` pool's cluster (`kubernetes.flavor`)."""

_SA_KEY_FIELDS = ("client_email", "private_key", "token_uri")


@dataclass(frozen=True)
class FlavorRules:
    name: Flavor
    check_credentials: Callable[[str], None]
    """Raises ValueError saying what the credentials should be."""
    needs_credentials: str | None
    """Why values without credentials are refused (None: they may be absent)."""
    needs_ca: str | None
    """Why values without caCertificate are refused (None: it may be absent)."""
    gpu_taint: bool
    """Whether its GPU nodes are tainted `nvidia.com/gpu` (the worker Job tolerates it)."""


def check_service_account_key(text: str) -> None:
    """flavor gke's credentials: a Google service account's JSON key file."""
    try:
        key = json.loads(text)
    except (ValueError, RecursionError):
        key = None
    missing = [] if isinstance(key, dict) else list(_SA_KEY_FIELDS)
    if isinstance(key, dict):
        if key.get("type") != "service_account":
            missing.append("type=service_account")
        missing += [f for f in _SA_KEY_FIELDS if not isinstance(key.get(f), str) or not key[f]]
        private_key = key.get("private_key")
        if isinstance(private_key, str) and "PRIVATE KEY-----" not in private_key:
            missing.append("a PEM private_key")
    if missing:
        raise ValueError(
            "not a service-account key: expected the JSON key file of a Google service account"
            f" (missing {', '.join(missing)}); attach-gke-pool.sh writes it to"
            " ~/.levers9/gke-sa.json"
        )


def generic_kubeconfig(text: str) -> dict[str, Any] | None:
    """flavor generic's credentials as a kubeconfig (YAML, or JSON on one line or many); None
    when they are a bearer token. ValueError when they look like a document but are not one."""
    if not (text.lstrip().startswith("{") or "\n" in text.strip()):
        return None
    import yaml

    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and doc.get("kind") == "Config"):
        raise ValueError(
            "for flavor generic, credentials is a bearer token (one line) or a kubeconfig"
            " (kind: Config)"
        )
    return doc


def _check_generic_credentials(text: str) -> None:
    generic_kubeconfig(text)


FLAVORS: MappingProxyType[str, FlavorRules] = MappingProxyType(
    {
        "gke": FlavorRules(
            name="gke",
            check_credentials=check_service_account_key,
            needs_credentials=(
                "flavor gke needs credentials (the service-account key, from a private values"
                " file) or credentialsFile"
            ),
            needs_ca="flavor gke needs caCertificate (the cluster's CA, base64 PEM)",
            # GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule.
            gpu_taint=True,
        ),
        "generic": FlavorRules(
            name="generic",
            check_credentials=_check_generic_credentials,
            needs_credentials=None,
            needs_ca=None,
            gpu_taint=False,
        ),
    }
)
JOINED_GPU_TAINT = True
"""A joined cluster's GPU nodes are tainted as GKE's are (the NVIDIA GPU operator's)."""


def flavor_rules(name: str) -> FlavorRules:
    """The flavor's rules; KeyError for one values validation would have refused."""
    return FLAVORS[name]
