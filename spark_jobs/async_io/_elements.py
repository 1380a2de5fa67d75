"""Stream elements that flow through operators: records and in-band markers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Marker", "StreamRecord", "Watermark"]

T = TypeVar("T")


@dataclass(slots=True)
class StreamRecord(Generic[T]):
    value: T
    timestamp: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Marker:
    """An in-band control element (watermark, end of split, barrier).

    The async operator never reorders records across a marker: every record that entered before
    it is emitted before it, and no later record is emitted before it.
    """

    payload: Any = None


@dataclass(frozen=True, slots=True)
class Watermark(Marker):
    """Event time has reached ``timestamp`` (ms): no later record will be older than it."""

    timestamp: int
