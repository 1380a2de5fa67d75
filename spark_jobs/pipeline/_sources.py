"""What every source spec shares: the fields the platform validates for all connectors.

A source spec is the user's immutable definition value of one connector (``FileSource``,
``TableSource``, or one registered with :func:`spark_jobs.connectors.register_source`).
Nothing is checked when one is built: the :class:`~spark_jobs.pipeline.Pipeline` that holds
it validates everything at once and names itself, the part and the field in its error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["LATE_POLICIES", "LatePolicy", "Source"]

#: ``late_records``: dead-letter a late record (reason ``late``), or reopen its partition.
LatePolicy = Literal["dead_letter", "reopen"]
LATE_POLICIES: tuple[LatePolicy, ...] = ("dead_letter", "reopen")


class Source(Protocol):
    """The fields every source spec has (a frozen dataclass of the connector's own)."""

    @property
    def schema(self) -> Mapping[str, TypeSpec]: ...
    @property
    def required(self) -> Sequence[str]: ...
    @property
    def event_time(self) -> str | None: ...
    @property
    def out_of_orderness(self) -> Duration: ...
    @property
    def idle_timeout(self) -> Duration: ...
    @property
    def late_records(self) -> LatePolicy: ...
