"""The key a lakehouse table is written with, recorded in the table itself.

A table one pipeline upserts by key and another appends to (or upserts by another key) ends
with keys twice — silently, in a format that enforces no key. So the first Sluice pipeline
that prepares a table records its ``upsert_key`` in a table property (``sluice.upsert-key``:
the key fields joined by ``,``, or ``""`` for an append sink), and every later one must write
the same way, or is refused before its run with one line naming ``upsert_key``.

Threading: called by the driver's prepare step (blocking catalog / store I/O).
"""

from __future__ import annotations

from collections.abc import Sequence

from enumerator_service import ConfigError

__all__ = ["UPSERT_KEY_PROPERTY", "check_recorded_key", "recorded_value"]

UPSERT_KEY_PROPERTY = "sluice.upsert-key"


def recorded_value(key: Sequence[str] | None) -> str:
    """The property's value for ``key`` (None: an append sink)."""
    return ",".join(key or ())


def _shown(value: str) -> str:
    return f"upserted by ({value})" if value else "appended to"


def _verb(value: str) -> str:
    return f"upserts by ({value})" if value else "appends"


def check_recorded_key(
    recorded: str | None, key: Sequence[str] | None, table: str, what: str
) -> bool:
    """True when the table records no key yet (the caller records it); ConfigError naming
    ``<what>(upsert_key)`` when it records another."""
    if recorded is None:
        return True
    wanted = recorded_value(key)
    if recorded != wanted:
        raise ConfigError(
            f"{what}(upsert_key)",
            f"table {table} is {_shown(recorded)} (its property {UPSERT_KEY_PROPERTY}); "
            f"this pipeline {_verb(wanted)}: the table would hold a key twice",
        )
    return False
