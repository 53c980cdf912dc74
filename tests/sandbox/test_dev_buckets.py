"""The dev stack's buckets on moto's S3: `dev up` makes one per dev workspace (levers9-default),
again without error when it is there, and writes moto's test keys as a credentials file that
`levers9 volume create --credentials-file` reads (mode 0600); the hint it prints is that
command."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from levers9.core.volumes import parse_credentials
from sandbox import aws, buckets


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[aws.LocalMoto]:
    server = aws.LocalMoto(tmp_path_factory.mktemp("moto") / "moto.log").start()
    try:
        yield server
    finally:
        server.stop()


def test_dev_up_makes_each_dev_workspaces_bucket_once(moto: aws.LocalMoto) -> None:
    assert buckets.ensure_buckets(moto.endpoint) == ["levers9-default"]
    assert buckets.ensure_buckets(moto.endpoint, ("default", "team-a")) == [
        "levers9-default",
        "levers9-team-a",
    ]
    listed = [b["Name"] for b in buckets.s3_client(moto.endpoint).list_buckets()["Buckets"]]
    assert sorted(listed) == ["levers9-default", "levers9-team-a"]


def test_the_credentials_file_reads_as_volume_create_reads_it(tmp_path: Path) -> None:
    path = buckets.write_credentials(tmp_path / buckets.CREDENTIALS_FILE)
    assert path.stat().st_mode & 0o777 == 0o600
    credentials = parse_credentials(path.read_text(), str(path))
    assert credentials.access_key_id == aws.ACCESS_KEY_ID
    hint = shlex.split(buckets.volume_hint("http://127.0.0.1:5052/", "levers9-default", path))
    assert hint == [
        "levers9",
        "volume",
        "create",
        "data",
        "--bucket",
        "s3://levers9-default",
        "--endpoint",
        "http://127.0.0.1:5052",
        "--credentials-file",
        str(path),
    ]
