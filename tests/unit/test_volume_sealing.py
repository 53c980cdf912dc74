"""A volume's bucket and credentials as the CLI reads and the controlplane keeps them: the AWS
shared-credentials file (a malformed one refused naming the line or field, never quoting a
value), the bucket URL, and the sealing (AES-GCM under a key derived from the controlplane's
secret and a generation): the ciphertext opens only with that secret, generation and volume."""

from __future__ import annotations

import pytest

from levers9.core.volumes import (
    Credentials,
    CredentialsFileError,
    parse_bucket,
    parse_credentials,
    sealing_context,
)
from levers9.sealed import Unsealable, seal, unseal

KEY_ID = "AKIAMARKERKEYID0001"
SECRET = "marker/Secret+Value0123456789abcdefABCDEF"
GOOD = f"""# a comment
[other]
aws_access_key_id = NOTTHISONE

[default]
aws_access_key_id = {KEY_ID}
aws_secret_access_key={SECRET}
"""


def test_the_default_section_is_read() -> None:
    credentials = parse_credentials(GOOD, "creds")
    assert credentials.access_key_id == KEY_ID
    assert credentials.secret_access_key == SECRET
    assert SECRET not in repr(credentials)
    assert SECRET not in str(credentials)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"[default]\naws_access_key_id = {KEY_ID}\n", "[default] has no aws_secret_access_key"),
        (f"[default]\naws_secret_access_key = {SECRET}\n", "[default] has no aws_access_key_id"),
        (f"[default]\naws_access_key_id {KEY_ID}\n{SECRET}\n", "creds line 2: neither"),
        (f"aws_secret_access_key = {SECRET}\n", "creds line 1: aws_secret_access_key before"),
        (f"[prod]\naws_secret_access_key = {SECRET}\n", "no [default] section (sections: [prod])"),
        (
            f"[default]\naws_access_key_id={KEY_ID}\naws_secret_access_key={SECRET}\n"
            "aws_session_token=abc\n",
            "aws_session_token",
        ),
    ],
)
def test_a_malformed_file_is_refused_naming_the_line_or_field_never_the_secret(
    text: str, says: str
) -> None:
    with pytest.raises(CredentialsFileError) as refused:
        parse_credentials(text, "creds")
    assert says in str(refused.value)
    assert SECRET not in str(refused.value)
    assert KEY_ID not in str(refused.value)


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("s3://levers9-default", "s3://levers9-default"),
        ("s3://bucket.example/runs/a/", "s3://bucket.example/runs/a"),
        ("gs://my-bucket/x", "gs://my-bucket/x"),
    ],
)
def test_a_bucket_url(given: str, url: str) -> None:
    assert parse_bucket(given).url == url


@pytest.mark.parametrize("given", ["levers9", "http://b", "s3://B", "s3://ab", "s3://b1/../x"])
def test_a_bad_bucket_url_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match=r"bucket|s3://BUCKET|prefix"):
        parse_bucket(given)


def test_sealed_credentials_open_only_with_the_secret_generation_and_volume() -> None:
    credentials = Credentials(access_key_id=KEY_ID, secret_access_key=SECRET)
    context = sealing_context("team-a", "data")
    sealed = seal("controlplane-secret", 2, credentials, context)
    assert sealed.generation == 2
    assert SECRET not in sealed.model_dump_json()
    assert KEY_ID not in sealed.model_dump_json()
    assert unseal("controlplane-secret", sealed, context) == credentials
    with pytest.raises(Unsealable, match="generation 2"):
        unseal("another-secret", sealed, context)
    with pytest.raises(Unsealable):
        unseal("controlplane-secret", sealed, sealing_context("team-b", "data"))
    with pytest.raises(Unsealable):
        unseal(
            "controlplane-secret",
            sealed.model_copy(update={"generation": 1}),
            context,
        )
    again = seal("controlplane-secret", 2, credentials, context)
    assert again.nonce != sealed.nonce
    assert again.ciphertext != sealed.ciphertext
