"""The agent's independence is an allow-list over packages (.importlinter's `only` contract,
`tests/import_rules.py`): checked on package trees built here, a module of the container that is
not allowed is forbidden to the source from the day it is added, directly or through an allowed
module; and the repository's own `agent` contract is that rule over levers9."""

from __future__ import annotations

import configparser
import itertools
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import grimp
import pytest
from importlinter import configuration

from tests.import_rules import OnlyContract

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()

Check = Callable[[Mapping[str, str]], bool]


@pytest.fixture
def check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Check:
    """Writes a package (module path → source) of a name of its own and says whether the
    `only` contract (its `agent` may import only its `wire`) holds over it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    configuration.configure()  # what lint-imports sets up before it checks (its timer)

    def run(files: Mapping[str, str]) -> bool:
        package = f"only_{next(_names)}"
        for path, source in {"__init__.py": "", **files}.items():
            target = tmp_path / package / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(source.replace("PKG", package)))
        contract = OnlyContract(
            "agent",
            session_options={"root_packages": [package]},
            contract_options={
                "source_modules": [f"{package}.agent"],
                "container": package,
                "allowed_modules": [f"{package}.wire"],
            },
        )
        graph = grimp.build_graph(package, cache_dir=None)
        return contract.check(graph, verbose=False).kept

    return run


AGENT = {"agent/__init__.py": "", "agent/main.py": "from PKG.wire import codec\n"}
WIRE = {"wire/__init__.py": "", "wire/codec.py": ""}


def test_imports_of_the_allowed_package_and_of_itself_are_kept(check: Check) -> None:
    files = {**AGENT, **WIRE, "agent/more.py": "from PKG.agent import main\n"}
    assert check(files)


def test_a_module_added_beside_them_is_forbidden_without_being_listed(check: Check) -> None:
    files = {**AGENT, **WIRE, "records.py": "", "agent/more.py": "import PKG.records\n"}
    assert not check(files)


def test_a_package_reached_through_an_allowed_one_is_forbidden(check: Check) -> None:
    files = {**AGENT, **WIRE, "records/__init__.py": "", "wire/codec.py": "import PKG.records\n"}
    assert not check(files)


def test_an_allowed_module_that_does_not_exist_is_refused(check: Check) -> None:
    with pytest.raises(ValueError, match="allowed_modules not in the graph"):
        check(AGENT)


def test_the_agent_contract_is_the_allow_list_rule_over_levers9() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    contract = config["importlinter:contract:agent"]
    assert contract["type"] == "only"
    assert config["importlinter"]["contract_types"].split() == [
        "only:",
        "tests.import_rules.OnlyContract",
    ]
    assert (contract["source_modules"].split(), contract["container"]) == (
        ["levers9.worker"],
        "levers9",
    )
    assert set(contract["forbidden_modules"].split()) == {"workflows", "activities", "sandbox"}
