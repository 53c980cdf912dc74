"""Finds secrets in text: the needles of a service-account key and tokens, and a scan that also
reads what Temporal's JSON hides in base64 (payload data, metadata)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator
from typing import Any

# A key's PEM body lines are 64 characters; any 32 of them are a needle nothing else contains.
NEEDLE_LENGTH = 32


def key_needles(key_json: str) -> list[str]:
    """What would betray a service-account key: its id and every line of its private key."""
    key = json.loads(key_json)
    return [key["private_key_id"], *pem_needles(key["private_key"])]


def pem_needles(pem: str) -> list[str]:
    """What would betray a PEM private key: the start of each of its body lines."""
    lines = [
        line
        for line in pem.splitlines()
        if line and not line.startswith("-----") and len(line) >= NEEDLE_LENGTH
    ]
    return [line[:NEEDLE_LENGTH] for line in lines]


def _decoded_strings(node: Any) -> Iterator[str]:
    """Every string in a JSON document, and the base64 strings decoded (Temporal's CLI prints
    payload data and metadata that way)."""
    if isinstance(node, dict):
        for value in node.values():
            yield from _decoded_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _decoded_strings(value)
    elif isinstance(node, str):
        yield node
        if len(node) >= 8 and len(node) % 4 == 0:
            try:
                decoded = base64.b64decode(node, validate=True).decode("utf-8", errors="replace")
            except (binascii.Error, ValueError):
                return
            yield decoded


def corpus_of_json(text: str) -> str:
    """A JSON document as searchable text: itself, and its decoded base64 strings."""
    return "\n".join([text, *_decoded_strings(json.loads(text))])


def hits(corpus: str, needles: Iterable[str]) -> list[str]:
    """The needles found, each shortened so a failure never prints a whole secret."""
    found = []
    for needle in needles:
        # A key's JSON escapes its newlines, so a needle is searched both ways.
        if needle in corpus or needle in corpus.replace("\\n", "\n"):
            found.append(needle[:6] + "...")
    return found
