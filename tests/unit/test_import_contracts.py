"""The agent's independence is an allow-list over packages (.importlinter's `only` contract,
`tests/import_rules.py`): checked on package trees built here, a module of the container that is
not allowed is forbidden to the source from the day it is added, directly or through an allowed
module; and the repository's own `agent` contract is that rule over levers9. Over the real
tree: the emulator takes of levers9 only the shared core (`emulator-core`), and only the dev
commands take the dev stack (`devstack`), each refusing an import added against it."""

from __future__ import annotations

import configparser
import itertools
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import grimp
import pytest
from importlinter import configuration
from importlinter.contracts.forbidden import ForbiddenContract

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
        ["levers9.agent"],
        "levers9",
    )
    assert set(contract["forbidden_modules"].split()) == {"workflows", "activities", "sandbox"}


def _repository_contract(section: str, added: tuple[str, str] | None = None) -> bool:
    """Whether the repository's contract `section` (.importlinter) holds over the tree, with the
    import `added` (importer, imported) when given. A fresh graph each time: a check removes the
    contract's ignored imports from the graph it is given."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    given = config[f"importlinter:contract:{section}"]
    options: dict[str, str | list[str]] = {
        key: given[key].split() for key in given if key.endswith("_modules")
    }
    options["ignore_imports"] = [
        line for line in given.get("ignore_imports", "").splitlines() if line
    ]
    if "container" in given:
        options["container"] = given["container"]
    kind = {"only": OnlyContract, "forbidden": ForbiddenContract}[given["type"]]
    roots = config["importlinter"]["root_packages"].split()
    graph = grimp.build_graph(*roots, cache_dir=None, exclude_type_checking_imports=True)
    if added is not None:
        graph.add_import(importer=added[0], imported=added[1])
    contract = kind(section, session_options={"root_packages": roots}, contract_options=options)
    return bool(contract.check(graph, verbose=False).kept)


@pytest.mark.parametrize(
    ("section", "importer", "imported"),
    [
        ("emulator-core", "sandbox.serve", "levers9.config"),
        ("emulator-core", "sandbox.cluster.kubelet", "levers9.cli.runtime"),
        ("emulator-core", "sandbox.persist", "levers9.devstack.values"),
        ("emulator-core", "sandbox.serve", "levers9.agent.runc_runtime"),
        ("devstack", "levers9.gateway.server", "levers9.devstack.stack"),
        ("devstack", "levers9.cli.main", "levers9.devstack.values"),
        ("devstack", "workflows.pool", "levers9.devstack.values"),
    ],
)
def test_the_emulator_takes_only_the_shared_core_and_only_the_dev_commands_the_dev_stack(
    section: str, importer: str, imported: str
) -> None:
    """The repository's `emulator-core` and `devstack` contracts hold over the tree, and each
    refuses an import it forbids, added to the tree's graph."""
    configuration.configure()
    assert _repository_contract(section)
    assert not _repository_contract(section, (importer, imported))


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("levers9.records.listing", "levers9.cli.output"),
        ("levers9.records.tasks", "levers9.gateway.task_service"),
        ("levers9.records.found", "levers9.agent.runtime"),
        ("levers9.records.clusters", "levers9.devstack.values"),
    ],
)
def test_the_records_layer_never_reaches_up_to_its_readers(importer: str, imported: str) -> None:
    """The repository's `records` contract holds over the tree, and refuses an import of the
    CLI, the gateway, the worker agent or the dev stack added to the records package."""
    configuration.configure()
    assert _repository_contract("records")
    assert not _repository_contract("records", (importer, imported))
