"""The CLI's profile file (`levers9.profiles`) and which identity a command takes
(`levers9.cli.identity`): written 0600 and read back whole; refused, naming the file and the fix,
when others may read it or it is malformed; tokens masked; LEVERS9_TOKEN and the shell's
LEVERS9_API_TOKEN beat the profile, the profile beats the dev stack's env file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from levers9.cli.identity import Identity, resolve, selected_profile
from levers9.cli.runtime import CliState
from levers9.config import ControlplaneSettings
from levers9.profiles import (
    Profile,
    ProfileError,
    Profiles,
    config_path,
    mask,
    read_profiles,
    write_profiles,
)

TOKEN = "l9k1.team-a.0123456789ab.s3cr3t-s3cr3t-s3cr3t"
IDENTITY_VARIABLES = (
    "LEVERS9_TOKEN",
    "LEVERS9_API_TOKEN",
    "LEVERS9_API_TOKEN_FILE",
    "LEVERS9_GATEWAY_ADDRESS",
    "LEVERS9_GATEWAY_TLS",
    "LEVERS9_GATEWAY_TLS_CA_FILE",
    "LEVERS9_PROFILE",
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A LEVERS9_HOME of its own, and none of the identity variables of the shell."""
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path / "home"))
    for key in IDENTITY_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "home"


def _team_a(ca: Path | None = None) -> Profile:
    return Profile(
        controlplane="gateway.example.com:443", tls=True, ca_file=ca, token=SecretStr(TOKEN)
    )


def _written(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_file_is_under_levers9_home_or_the_users_home(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert config_path() == home / "config"
    monkeypatch.delenv("LEVERS9_HOME")
    assert config_path() == Path.home() / ".levers9" / "config"


def test_profiles_are_written_0600_and_read_back(home: Path) -> None:
    path = config_path()
    profiles = Profiles().with_profile("team-a", _team_a(home / "ca.crt"), current=True)
    write_profiles(path, profiles.with_profile("prod", _team_a(), current=False))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    read = read_profiles(path)
    assert read.current == "team-a"
    assert sorted(read.profiles) == ["prod", "team-a"]
    assert read.profiles["team-a"].token.get_secret_value() == TOKEN
    assert read.profiles["team-a"].ca_file == home / "ca.crt"
    assert read.using("prod").current == "prod"


def test_no_file_is_no_profiles(home: Path) -> None:
    assert read_profiles(config_path()) == Profiles()
    assert selected_profile(CliState()) is None


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_file_others_may_read_is_refused_naming_the_chmod(home: Path, mode: int) -> None:
    path = config_path()
    write_profiles(path, Profiles().with_profile("team-a", _team_a(), current=True))
    path.chmod(mode)
    with pytest.raises(ProfileError) as refused:
        read_profiles(path)
    assert str(path) in str(refused.value)
    assert f"chmod 600 {path}" in str(refused.value)
    assert TOKEN not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("current: [unclosed\n", "not YAML"),
        ("- a list\n", "not a map of current and profiles"),
        ("profiles:\n  team-a:\n    controlplane: h:1\n", "profiles.team-a.token: Field required"),
        (
            f"profiles:\n  team-a:\n    controlplane: h:1\n    token: {TOKEN}\n    colour: red\n",
            "profiles.team-a.colour: Extra inputs are not permitted",
        ),
        (
            f"profiles:\n  Team_A:\n    controlplane: h:1\n    token: {TOKEN}\n",
            "'Team_A' is not a profile name",
        ),
        (
            f"current: team-b\nprofiles:\n  team-a:\n    controlplane: h:1\n    token: {TOKEN}\n",
            "current names profile team-b, which the file does not hold",
        ),
    ],
)
def test_a_malformed_file_is_refused_naming_the_file_and_the_field(
    home: Path, text: str, said: str
) -> None:
    path = _written(config_path(), text)
    with pytest.raises(ProfileError) as refused:
        read_profiles(path)
    assert str(path) in str(refused.value)
    assert said in str(refused.value)
    assert TOKEN not in str(refused.value)
    assert "s3cr3t" not in str(refused.value)


def test_a_named_profile_the_file_lacks_names_the_ones_it_holds(home: Path) -> None:
    write_profiles(config_path(), Profiles().with_profile("team-a", _team_a(), current=False))
    with pytest.raises(ProfileError) as refused:
        selected_profile(CliState(profile="team-b"))
    assert "no profile team-b" in str(refused.value)
    assert "it holds team-a" in str(refused.value)
    assert selected_profile(CliState(profile="team-b"), missing_ok=True) is None
    with pytest.raises(ProfileError, match="--profile: 'Bad!' is not a profile name"):
        selected_profile(CliState(profile="Bad!"))


def test_a_mask_keeps_the_workspace_and_id_never_the_secret() -> None:
    assert mask(TOKEN) == "l9k1.team-a.0123456789ab.***"
    assert mask("an-operator-token") == "***"


def _settings() -> ControlplaneSettings:
    return ControlplaneSettings.model_validate({})


def _token(identity: Identity) -> str | None:
    token = identity.settings.operator_token()
    return None if token is None else token.get_secret_value()


def test_the_current_profile_beats_the_dev_env_file(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_profiles(
        config_path(), Profiles().with_profile("team-a", _team_a(home / "ca"), current=True)
    )
    monkeypatch.setenv("LEVERS9_GATEWAY_ADDRESS", "127.0.0.1:7443")
    monkeypatch.setenv("LEVERS9_API_TOKEN_FILE", str(home / "api-token"))
    dev = frozenset({"LEVERS9_GATEWAY_ADDRESS", "LEVERS9_API_TOKEN_FILE"})
    identity = resolve(_settings(), CliState(dev_keys=dev))
    assert identity.profile == "team-a"
    assert identity.settings.cli_gateway_address() == "gateway.example.com:443"
    assert identity.settings.gateway_tls_ca_file == home / "ca"
    assert _token(identity) == TOKEN
    assert identity.token_source == "profile team-a"


def test_the_shells_variables_beat_the_profile(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profiles(config_path(), Profiles().with_profile("team-a", _team_a(), current=True))
    monkeypatch.setenv("LEVERS9_GATEWAY_ADDRESS", "10.0.0.1:7443")
    monkeypatch.setenv("LEVERS9_API_TOKEN", "the-shells")
    identity = resolve(_settings(), CliState())
    assert identity.settings.cli_gateway_address() == "10.0.0.1:7443"
    assert _token(identity) == "the-shells"
    assert (identity.token_source, identity.address_source) == (
        "LEVERS9_API_TOKEN",
        "LEVERS9_GATEWAY_ADDRESS",
    )


def test_levers9_token_beats_every_other_token(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profiles(config_path(), Profiles().with_profile("team-a", _team_a(), current=True))
    monkeypatch.setenv("LEVERS9_API_TOKEN", "the-shells")
    monkeypatch.setenv("LEVERS9_TOKEN", "for-one-command")
    identity = resolve(_settings(), CliState())
    assert _token(identity) == "for-one-command"
    assert identity.token_source == "LEVERS9_TOKEN"
    # The profile still says where the gateway is.
    assert identity.settings.cli_gateway_address() == "gateway.example.com:443"


def test_profile_option_picks_another_than_the_current(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prod = Profile(controlplane="prod:443", token=SecretStr("operator-of-prod"))
    profiles = Profiles().with_profile("team-a", _team_a(), current=True)
    write_profiles(config_path(), profiles.with_profile("prod", prod, current=False))
    identity = resolve(_settings(), CliState(profile="prod"))
    assert identity.profile == "prod"
    assert identity.settings.cli_gateway_address() == "prod:443"
    assert os.environ.get("LEVERS9_TOKEN") is None
