"""Warnings the docs' own code meets that are Dagster's, not the reader's: the suite turns
warnings into errors, a reader's Python only prints them."""

from __future__ import annotations

import pytest

#: dagster 1.13 warns about its own ``owners`` parameter when a ``Definitions`` object attaches
#: resources to its sensors (``defs().resolve_*``); the sensors set no owners.
_DAGSTER_OWNERS = pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name == "test_doc_blocks.py":
            item.add_marker(_DAGSTER_OWNERS)
