"""Kubernetes API clients built from the pool config loaded in this Temporal worker.

Flavor gke: the service-account key goes through google-auth (a signed JWT exchanged at the
key's `token_uri`), and the bearer token is refreshed before it expires, or at once when the
cluster answers 401 (the token was revoked or expired early): the call is then sent again, once,
with the new token; endpoint and CA from the pool block. Flavor generic: a bearer token, or a
kubeconfig. Nothing here passes through Temporal: activities receive a pool *name* and look the
client up.
"""

from __future__ import annotations

import base64
import json
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from google.auth.transport.requests import Request
from google.oauth2 import service_account
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from levers9.config import PoolConfig
from levers9.providers.flavors import generic_kubeconfig

GKE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
REQUEST_TIMEOUT_S = (5.0, 30.0)
"""(connect, read) for every API call: a dropped packet must not hang a reconcile."""


class UnknownPool(KeyError):
    """The pool is not in this Temporal worker's values."""


class _GkeToken:
    """A bearer token from a service-account key, refreshed when google-auth says so."""

    def __init__(self, key_info: Mapping[str, str]) -> None:
        self._credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            dict(key_info), scopes=list(GKE_SCOPES)
        )
        self._lock = threading.Lock()

    def header(self) -> str:
        with self._lock:
            if not self._credentials.valid:
                self._credentials.refresh(Request())
            return f"Bearer {self._credentials.token}"

    def renew(self, rejected: str | None) -> str:
        """A fresh header after the cluster refused `rejected` (401): the key is exchanged
        again unless another thread already replaced that token."""
        with self._lock:
            if rejected is None or rejected == f"Bearer {self._credentials.token}":
                self._credentials.refresh(Request())
            return f"Bearer {self._credentials.token}"


def _write_ca(ca_base64: str, directory: Path) -> str:
    # The client wants a file path; the CA is public, the directory is private to this process.
    path = directory / "ca.crt"
    path.write_bytes(base64.b64decode(ca_base64))
    return str(path)


def joined_api_client(url: str) -> k8s.ApiClient:
    """A joined cluster's ApiClient: plain HTTP to this process's loopback end of the agent's
    tunnel; the agent adds its service account's token and speaks TLS to its API server."""
    configuration = k8s.Configuration()
    configuration.host = url
    return _with_timeout(k8s.ApiClient(configuration))


def build_api_client(pool: PoolConfig, scratch: Path) -> k8s.ApiClient:
    """An ApiClient for the pool's cluster; raises ValueError naming what is missing."""
    kube = pool.kubernetes
    secret = kube.resolved_credentials()
    text = secret.get_secret_value() if secret else None
    kubeconfig = generic_kubeconfig(text) if kube.flavor == "generic" and text else None
    if kubeconfig is not None:
        configuration = k8s.Configuration()
        k8s_config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            kubeconfig, client_configuration=configuration
        )
        return _with_timeout(k8s.ApiClient(configuration))
    gke_token: _GkeToken | None = None
    configuration = k8s.Configuration()
    configuration.host = kube.endpoint
    if kube.ca_certificate:
        configuration.ssl_ca_cert = _write_ca(kube.ca_certificate, scratch)
    if kube.flavor == "gke":
        if not text:
            raise ValueError("flavor gke needs credentials")
        token = gke_token = _GkeToken(json.loads(text))
        configuration.api_key = {"authorization": ""}

        def refresh(config: k8s.Configuration) -> None:
            config.api_key["authorization"] = token.header()

        configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
    elif text:
        configuration.api_key = {"authorization": f"Bearer {text.strip()}"}
    return _with_timeout(k8s.ApiClient(configuration), gke_token)


def _with_timeout(api: k8s.ApiClient, token: _GkeToken | None = None) -> k8s.ApiClient:
    """Every call of `api` gets REQUEST_TIMEOUT_S unless it sets its own: the generated API
    methods pass `_request_timeout=None` by default, and urllib3 then waits forever for a
    cluster that drops the packets of an address off its authorized networks (GKE does).

    With a GKE `token`, a call answered 401 is sent once more with a renewed token. This
    wraps `call_api`, which returns the response before anything reads its body (the generated
    methods raise ApiException after it returns, and hand a watch its stream only then), so a
    retry never repeats a stream already partly consumed: only the refused request's status
    was seen, and its short Status body is read and dropped.
    """
    call_api = api.call_api

    def timed(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = REQUEST_TIMEOUT_S
        response = call_api(*args, **kwargs)
        if token is None or response.status != 401:
            return response
        response.read()  # type: ignore[no-untyped-call]  # the refused Status, unseen by callers
        positional = len(args) > 2  # call_api(method, url, header_params, ...)
        headers = dict((args[2] if positional else kwargs.get("header_params")) or {})
        headers["authorization"] = token.renew(headers.get("authorization"))
        if positional:
            args = (*args[:2], headers, *args[3:])
        else:
            kwargs["header_params"] = headers
        return call_api(*args, **kwargs)

    api.call_api = timed  # type: ignore[method-assign]
    return api


class KubeClients:
    """One ApiClient per pool, built on first use from the pool config."""

    def __init__(
        self,
        pools: Mapping[str, PoolConfig],
        joined: Callable[[str], str] | None = None,
    ) -> None:
        """`joined`: a joined pool's name -> the URL of its agent's proxy (this process's
        loopback end of the agent's tunnel)."""
        self._pools = dict(pools)
        self._joined = joined
        self._clients: dict[str, k8s.ApiClient] = {}
        self._lock = threading.Lock()
        self._scratch = tempfile.TemporaryDirectory(prefix="levers9-kube-")

    def names(self) -> list[str]:
        """The pools loaded, sorted."""
        return sorted(self._pools)

    def pool(self, name: str) -> PoolConfig:
        try:
            return self._pools[name]
        except KeyError:
            raise UnknownPool(name) from None

    def loaded(self, name: str) -> bool:
        """Pool `name` is loaded here (from the values, or joined)."""
        return name in self._pools

    def joined(self, name: str) -> bool:
        """Pool `name` was joined (`levers9 cluster join`); False for an unknown one."""
        pool = self._pools.get(name)
        return pool is not None and pool.kubernetes.joined

    def set_joined(self, joined: Callable[[str], str]) -> None:
        """Where joined pools are reached (the cluster hub's loopback listeners)."""
        self._joined = joined

    def add(self, name: str, pool: PoolConfig) -> None:
        """A pool joined while the process runs (`levers9 cluster join`)."""
        with self._lock:
            self._pools[name] = pool
            old = self._clients.pop(name, None)
        if old is not None:
            old.close()  # type: ignore[no-untyped-call]

    def api(self, name: str) -> k8s.ApiClient:
        with self._lock:
            if name not in self._clients:
                pool = self.pool(name)
                if pool.kubernetes.joined:
                    if self._joined is None:
                        raise ValueError(
                            f"pool {name} was joined (`levers9 cluster join`), and this"
                            " process reaches no joined cluster"
                        )
                    self._clients[name] = joined_api_client(self._joined(name))
                else:
                    directory = Path(self._scratch.name) / name
                    directory.mkdir(exist_ok=True)
                    self._clients[name] = build_api_client(pool, directory)
            return self._clients[name]

    def close(self) -> None:
        for api in self._clients.values():
            api.close()  # type: ignore[no-untyped-call]
        self._scratch.cleanup()
