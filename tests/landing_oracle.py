"""An independent oracle of the landing files for end-to-end tests: which events are
well-formed, and how many lines are malformed — parsed with the standard library's ``json``,
not with Sluice's own parser. Importable from every test folder (``tests/`` is on the path
through its conftest)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["expected_events"]


def expected_events(landing: Path) -> tuple[list[dict[str, Any]], int]:
    """The well-formed events of every ``dt=*/*.jsonl`` file under ``landing`` (their fields,
    ``event_time`` in UTC, ``amount`` as float, ``dt`` = the folder's date) and the number of
    malformed lines. Blank lines are neither."""
    good: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(landing.glob("dt=*/*.jsonl")):
        day = path.parent.name.removeprefix("dt=")
        for raw in path.read_bytes().splitlines():
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
                when = datetime.fromisoformat(obj["event_time"])
                ok = (
                    isinstance(obj["event_id"], str)
                    and type(obj["user_id"]) is int
                    and isinstance(obj["event_type"], str)
                    and type(obj["amount"]) in (int, float)
                )
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                good.append(
                    {
                        **obj,
                        "event_time": when.astimezone(UTC),
                        "amount": float(obj["amount"]),
                        "dt": day,
                    }
                )
            else:
                bad += 1
    return good, bad
