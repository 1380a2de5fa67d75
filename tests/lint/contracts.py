"""An import-linter contract of Sluice's own: no private module across top-level packages.

Inside a top-level package (``spark_jobs``) its parts import each other's private modules
freely; another package (``dagster_project``, the ``examples``) imports only public names —
what a package's public modules and ``__init__`` re-export. A private module is one with a
path component starting with ``_`` (``enumerator_service._split_store``,
``spark_jobs.connectors.files._reader``). ``lint-imports`` (``make lint``) checks it with the
layer contracts configured in ``pyproject.toml``.
"""

from __future__ import annotations

from typing import Any

import grimp
from importlinter.application import output
from importlinter.domain.contract import Contract, ContractCheck

__all__ = ["NoCrossPackagePrivateImports"]


def _private(module: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))


class NoCrossPackagePrivateImports(Contract):
    """Private modules are imported only from within their own top-level package."""

    type_name = "no_cross_package_private"

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        illegal: list[dict[str, Any]] = []
        for imported in sorted(graph.modules):
            if not _private(imported):
                continue
            top = imported.split(".", 1)[0]
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if importer.split(".", 1)[0] == top:
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = sorted({d["line_number"] for d in details})
                illegal.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("Private modules imported from another top-level package:", bold=False)
        output.new_line()
        for link in check.metadata["illegal"]:
            lines = ", ".join(map(str, link["lines"]))
            where = f"- {link['importer']} -> {link['imported']} (l.{lines})"
            output.print_error(where, bold=False)
        output.new_line()
        output.print("Import the name from the package's public module (add it to its __all__).")
