"""Worker tokens: an HMAC of the worker id under the controlplane's secret (pure).

A token names its worker, so a worker can only ever speak for itself; checking it needs no
lookup, only the secret, and compares in constant time. The operator token (the CLI's) is the
HMAC of a subject no worker id can take, so no worker token opens operator calls.

Each direction has its own credential: the worker token is what a worker presents to the
gateway; the command token (`command:<worker id>`) is what the controlplane presents to the
worker. The worker holds only the command token's SHA-256 (its Secret's `command-token.sha256`),
so nothing on the node, not the worker's own token nor its Secret, lets anyone command it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

PREFIX = "l9w1."
OPERATOR_PREFIX = "l9o1."
COMMAND_PREFIX = "l9c1."
_COMMAND_SUBJECT = "command:"  # as the operator's: no worker id holds a colon
_OPERATOR_SUBJECT = "operator:"  # no worker id starts with it (ids are [a-z0-9-])


def _generation(generation: int) -> str:
    """A label's generation suffix: none for the first (the derivation of before)."""
    return f":{generation}" if generation > 1 else ""


def worker_token(secret: str, worker_id: str, generation: int = 1) -> str:
    """What worker `worker_id` presents to the gateway. `generation` (the controlplane's
    `workerTokenGeneration`) rotates every worker's token, and command token, on its own."""
    subject = (worker_id + _generation(generation)).encode()
    digest = hmac.new(secret.encode(), subject, hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_matches(secret: str, worker_id: str, token: str, generation: int = 1) -> bool:
    expected = worker_token(secret, worker_id, generation)
    return hmac.compare_digest(expected.encode(), token.encode())


def operator_token(secret: str, generation: int = 1) -> str:
    """The token operators' calls to the controlplane carry (the CLI's `levers9 task logs`).

    `generation` (the controlplane's `operatorTokenGeneration`) rotates it on its own: each
    generation is another subject, so a leaked operator token is revoked by moving to the next
    one, and no worker is touched."""
    subject = _OPERATOR_SUBJECT + _generation(generation)
    digest = hmac.new(secret.encode(), subject.encode(), hashlib.sha256).digest()
    return OPERATOR_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def operator_token_matches(secret: str, token: str, generation: int = 1) -> bool:
    return hmac.compare_digest(operator_token(secret, generation).encode(), token.encode())


def command_token(secret: str, worker_id: str, generation: int = 1) -> str:
    """What the controlplane presents to worker `worker_id` (never the worker's own token)."""
    subject = (_COMMAND_SUBJECT + worker_id + _generation(generation)).encode()
    digest = hmac.new(secret.encode(), subject, hashlib.sha256).digest()
    return COMMAND_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def command_digest(token: str) -> str:
    """The SHA-256 (hex) of a command token: what the worker checks calls against."""
    return hashlib.sha256(token.encode()).hexdigest()


def command_metadata(
    secret: str, worker_id: str, generation: int = 1
) -> tuple[tuple[str, str], ...]:
    """What a controlplane call to WorkerService carries: its command token, and for a worker
    whose Job predates command tokens the worker's own as `authorization: Bearer` (such a
    worker has nothing else to check; a current one ignores it)."""
    from levers9.contract import COMMAND_TOKEN_HEADER
    from levers9.rpc import bearer

    return (
        (COMMAND_TOKEN_HEADER, command_token(secret, worker_id, generation)),
        *bearer.metadata(worker_token(secret, worker_id, generation)),
    )


AGENT_PREFIX = "l9a1."
_AGENT_SUBJECT = "cluster-agent:"  # no worker id holds a colon


def join_digest(join_token: str) -> str:
    """The SHA-256 (hex) of a join token: what the controlplane keeps of it (never the token)."""
    return hashlib.sha256(join_token.encode()).hexdigest()


def agent_token(secret: str, cluster_name: str, digest: str) -> str:
    """The in-cluster agent's own token, given for the join whose token has `digest`: a new
    join of the cluster (`levers9 cluster join` again) revokes the agent tokens of the last."""
    subject = f"{_AGENT_SUBJECT}{cluster_name}:{digest}".encode()
    mac = hmac.new(secret.encode(), subject, hashlib.sha256).digest()
    return AGENT_PREFIX + base64.urlsafe_b64encode(mac).decode().rstrip("=")


def agent_token_matches(secret: str, cluster_name: str, digest: str, token: str) -> bool:
    expected = agent_token(secret, cluster_name, digest)
    return hmac.compare_digest(expected.encode(), token.encode())
