"""Parsing and validation of event records (the RecordEmitter's conversion step)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

from spark_jobs.source._records import RawLine

__all__ = ["Event", "parse_event", "validate_event"]

_REQUIRED = ("event_id", "user_id", "event_time", "event_type", "amount")


class Event(NamedTuple):
    split_id: int
    event_id: str
    user_id: int
    event_time: datetime
    event_type: str
    amount: float


def parse_event(split_id: int, line: RawLine, max_line_bytes: int) -> Event | str | None:
    """The event in ``line``; a dead-letter reason (``"category: detail"``) if it is malformed;
    None for a blank line (not a record)."""
    if line.truncated:
        return f"line too long: over {max_line_bytes} bytes"
    data = line.data
    if not data.strip():
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "UTF-8" in str(exc):
            return "invalid UTF-8: line is not valid UTF-8 text"
        return f"invalid JSON: {exc}"
    if not isinstance(obj, dict):
        return f"wrong type: expected a JSON object, got {type(obj).__name__}"
    return validate_event(split_id, obj)


def validate_event(split_id: int, obj: dict[str, Any]) -> Event | str:
    """The event in a decoded record (JSON object, CSV row, Parquet row), or a dead-letter
    reason (``"category: detail"``)."""
    missing = [name for name in _REQUIRED if obj.get(name) is None]
    if missing:
        return f"missing field: {', '.join(missing)}"
    event_id, user_id, when = obj["event_id"], obj["user_id"], obj["event_time"]
    event_type, amount = obj["event_type"], obj["amount"]
    if not isinstance(event_id, str) or not event_id:
        return "wrong type: event_id must be a non-empty string"
    if not isinstance(user_id, int) or isinstance(user_id, bool):
        return "wrong type: user_id must be an integer"
    if not isinstance(event_type, str):
        return "wrong type: event_type must be a string"
    if not isinstance(amount, int | float) or isinstance(amount, bool):
        return "wrong type: amount must be a number"
    if not isinstance(when, str):
        return "wrong type: event_time must be an ISO-8601 string"
    try:
        event_time = datetime.fromisoformat(when)
    except ValueError:
        return f"bad value: event_time {when[:40]!r} is not ISO-8601"
    if event_time.tzinfo is None:
        event_time = event_time.replace(tzinfo=UTC)
    return Event(split_id, event_id, user_id, event_time, event_type, float(amount))
