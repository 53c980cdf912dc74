"""Sealing a workspace's bucket credentials under the controlplane's key: AES-GCM (256-bit) with a
key derived by HKDF-SHA256 from the controlplane's secret (`workerTokenSecret`, the one the
tokens are HMACs under) and a key generation (`volumeKeyGeneration`, raised to seal new
volumes under another key, as `operatorTokenGeneration` rotates the operator token).

A record keeps the ciphertext, its 96-bit random nonce and the generation; the associated data
binds it to its workspace and volume (`levers9.core.volumes.sealing_context`). Opening needs the
secret, which only the controlplane's processes hold (never Temporal): a history, a memo or a
backup of Temporal's database holds nothing that opens.
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from levers9.core.volumes import Credentials, Sealed

_INFO = b"levers9 volume credentials key:"
_SALT = b"levers9.sealed.v1"
NONCE_BYTES = 12


class Unsealable(Exception):
    """Sealed credentials that do not open under this controlplane's secret (another secret,
    or a record altered or moved); the message says so, never what it holds."""


def volume_key(secret: str, generation: int) -> bytes:
    """The AES-256 key of `generation`, derived from the controlplane's secret."""
    if generation < 1:
        raise ValueError(f"key generation {generation}: generations start at 1")
    return HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=_SALT,
        info=_INFO + str(generation).encode(),
    ).derive(secret.encode())


def seal(secret: str, generation: int, credentials: Credentials, context: bytes) -> Sealed:
    nonce = os.urandom(NONCE_BYTES)
    plaintext = credentials.model_dump_json().encode()
    ciphertext = AESGCM(volume_key(secret, generation)).encrypt(nonce, plaintext, context)
    return Sealed(
        ciphertext=base64.b64encode(ciphertext).decode(),
        nonce=base64.b64encode(nonce).decode(),
        generation=generation,
    )


def unseal(secret: str, sealed: Sealed, context: bytes) -> Credentials:
    """The credentials `seal` sealed with the same secret and context; Unsealable otherwise."""
    try:
        nonce = base64.b64decode(sealed.nonce, validate=True)
        ciphertext = base64.b64decode(sealed.ciphertext, validate=True)
        plaintext = AESGCM(volume_key(secret, sealed.generation)).decrypt(
            nonce, ciphertext, context
        )
    except (InvalidTag, ValueError):
        raise Unsealable(
            f"the credentials (key generation {sealed.generation}) do not open under this"
            " controlplane's secret: was workerTokenSecret changed? Create the volume again"
        ) from None
    return Credentials.model_validate_json(plaintext)
