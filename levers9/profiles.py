"""The CLI's profiles, as kubectl's contexts: `~/.levers9/config` (`$LEVERS9_HOME/config` when
LEVERS9_HOME is set) names, per profile, a controlplane's gateway and a token, and which profile
is current. `levers9 login` and `levers9 dev up` write it; every command reads it.

The file holds tokens, so it is written mode 0600 (by a rename: never half written) and refused,
naming the fix, when anyone but its owner may read it, as ssh refuses a private key. A malformed
file is refused naming the file, the field and the fix; nothing here ever quotes a token.

Shared by the CLI and the dev stack (which imports nothing of the CLI); no I/O at import time.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, ValidationError

from levers9.core.workspaces import parse_token, workspace_token
from levers9.files import write_private

PROFILE_NAME = r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$"
"""A profile's name: lowercase letters, digits, `-`, `_`, `.`, starting and ending alphanumeric."""
DEFAULT_PROFILE = "default"
DEV_PROFILE = "dev"
"""The profile `levers9 dev up` writes: the dev stack's gateway and operator token."""
ProfileName = Annotated[str, StringConstraints(pattern=PROFILE_NAME)]


class ProfileError(Exception):
    """The profile file cannot be used; the message names the file and what to do."""


class Profile(BaseModel):
    """One identity: where the gateway answers and the token to show it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    controlplane: str = Field(min_length=1)
    """The gateway's `host:port`."""
    tls: bool = True
    """Dial it with TLS (the system's roots, or `caFile`)."""
    ca_file: Path | None = Field(default=None, alias="caFile")
    """The CA that issued the gateway's certificate; the system's roots when unset."""
    token: SecretStr
    """The operator's token or a workspace's."""

    def document(self) -> dict[str, object]:
        written: dict[str, object] = {"controlplane": self.controlplane, "tls": self.tls}
        if self.ca_file is not None:
            written["caFile"] = str(self.ca_file)
        written["token"] = self.token.get_secret_value()
        return written


class Profiles(BaseModel):
    """The whole file: the profiles by name, and the current one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    current: ProfileName | None = None
    profiles: dict[ProfileName, Profile] = Field(default_factory=dict)

    def document(self) -> dict[str, object]:
        return {
            "current": self.current,
            "profiles": {name: p.document() for name, p in sorted(self.profiles.items())},
        }

    def with_profile(self, name: str, profile: Profile, *, current: bool) -> Profiles:
        profiles = {**self.profiles, name: profile}
        return Profiles(current=name if current else self.current, profiles=profiles)

    def using(self, name: str) -> Profiles:
        return Profiles(current=name, profiles=self.profiles)


def config_path() -> Path:
    """`$LEVERS9_HOME/config` when LEVERS9_HOME is set (a dev stack's, a test's), else
    `~/.levers9/config`."""
    home = os.environ.get("LEVERS9_HOME")
    base = Path(home) if home else Path.home() / ".levers9"
    return (base / "config").absolute()


def name_problem(name: str) -> str | None:
    """Why `name` is no profile name, or None."""
    if re.fullmatch(PROFILE_NAME, name):
        return None
    return (
        f"{name!r} is not a profile name: lowercase letters, digits, '-', '_' and '.',"
        " starting and ending with a letter or digit, at most 63 characters"
    )


def _field(location: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in location) or "(the whole file)"


def read_profiles(path: Path) -> Profiles:
    """The file's profiles (none when it does not exist); ProfileError naming the file, the
    field and the fix when it is readable by others or malformed."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return Profiles()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot be read ({exc.strerror})") from None
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise ProfileError(
            f"{path} may be read by others (mode {mode:04o}) and it holds tokens: chmod 600 {path}"
        )
    redo = f"fix it, or remove it and run `levers9 login` again ({path})"
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ProfileError(f"{path}: not YAML ({problem}): {redo}") from None
    if document is None:
        return Profiles()
    if not isinstance(document, dict):
        raise ProfileError(f"{path}: not a map of current and profiles: {redo}")
    named = document.get("profiles")
    names = [*(named if isinstance(named, dict) else {}), document.get("current")]
    for name in names:
        problem = name_problem(name) if isinstance(name, str) else None
        if problem is not None:
            raise ProfileError(f"{path}: {problem}: {redo}")
    try:
        profiles = Profiles.model_validate(document)
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        raise ProfileError(f"{path}: {_field(first['loc'])}: {first['msg']}: {redo}") from None
    if profiles.current is not None and profiles.current not in profiles.profiles:
        raise ProfileError(
            f"{path}: current names profile {profiles.current}, which the file does not hold:"
            f" levers9 profile use NAME, one of {', '.join(sorted(profiles.profiles)) or 'none'}"
        )
    return profiles


def write_profiles(path: Path, profiles: Profiles) -> None:
    """Writes the file whole, mode 0600 (its directory made 0700 when it is new)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    header = "# levers9's profiles (levers9 login, levers9 profile use); it holds tokens\n"
    write_private(path, header + yaml.safe_dump(profiles.document(), sort_keys=False))


def mask(token: str) -> str:
    """What a listing shows of a token: a workspace token's workspace and id (which `workspace
    token list` shows too), never a secret."""
    parsed = parse_token(token)
    if parsed is None:
        return "***"
    workspace, token_id, _ = parsed
    return workspace_token(workspace, token_id, "***")
