"""An import-linter contract type import-linter lacks: an allow-list (.importlinter's `only`).

`source_modules` may import, of `container`'s packages and modules, only `allowed_modules` (and
themselves), directly or through another module: every other child of `container` is forbidden
to them, whenever it was added, and so are `forbidden_modules` (other root packages). It is a
forbidden contract whose forbidden set is computed from the tree when it is checked, so the
agent's independence is a rule over packages, not a list of the controlplane's modules kept by
hand. Registered in .importlinter's `contract_types`; lint-imports imports it from the repository
root.
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter import fields
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.domain.contract import ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules
from importlinter.domain.imports import ModuleExpression


class OnlyContract(ForbiddenContract):
    type_name = "only"

    container = fields.StringField()
    allowed_modules = fields.SetField(subfield=fields.ModuleExpressionField())
    forbidden_modules = fields.SetField(subfield=fields.ModuleExpressionField(), required=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        container: Any = self.container
        allowed = {m.name for m in module_expressions_to_modules(graph, self._set("allowed"))}
        sources = {m.name for m in module_expressions_to_modules(graph, self._set("source"))}
        missing = sorted(allowed - graph.modules)
        if missing:
            raise ValueError(f"allowed_modules not in the graph: {', '.join(missing)}")
        rest = _forbidden_children(graph, container, allowed, sources)
        given = self._set("forbidden") or set()
        self.forbidden_modules = given | {ModuleExpression(m) for m in rest}  # type: ignore[assignment]
        return super().check(graph, verbose)

    def _set(self, kind: str) -> set[ModuleExpression]:
        value: Any = getattr(self, f"{kind}_modules")
        return set(value or ())


def _forbidden_children(
    graph: ImportGraph, package: str, allowed: set[str], sources: set[str]
) -> set[str]:
    """The children of `package` that are neither allowed nor a source; a child package that
    holds an allowed module (levers9.core for levers9.core.quantity) is opened in turn."""
    forbidden: set[str] = set()
    for child in graph.find_children(package):
        if child in allowed or any(_within(s, child) for s in sources):
            continue
        if any(_within(a, child) for a in allowed):
            forbidden |= _forbidden_children(graph, child, allowed, sources)
        else:
            forbidden.add(child)
    return forbidden


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
