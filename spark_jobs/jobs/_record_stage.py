"""A per-record ``AsyncMap``: the user's function once per record, through Flink's operator.

Each record of an incoming batch becomes one element of an
:class:`~spark_jobs.async_io.AsyncWaitOperator` (capacity, ordered/unordered/key, timeout and the
user's ``timeout()``, retries with result and exception predicates — the operator's own
semantics, per record). Completed records are collected per split and re-batched after every
run of emissions (the operator's ``flush``), so the steps after it see batches again.

A re-batched batch holds some records of a source range: its ``only`` lists their offsets,
which is what a checkpoint stores for it (and for records still in the operator), so restore
reads exactly those records again.

Threading: mailbox thread only; never blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from spark_jobs._dead_letters import BAD_VALUE
from spark_jobs.async_io import (
    NO_RETRY,
    AsyncFunction,
    AsyncRetryStrategy,
    AsyncWaitOperator,
    Marker,
    Output,
    OutputMode,
    StreamRecord,
)
from spark_jobs.jobs._stages import OperatorStage, PendingRange
from spark_jobs.jobs._user_errors import UserCodeError
from spark_jobs.jobs._user_functions import Completed
from spark_jobs.pipeline._plan import AsyncMapPlan
from spark_jobs.pipeline._types import type_name
from spark_jobs.runtime import MailboxProcessor
from spark_jobs.source._batch import OFFSET, Batch, DeadLetter, user_rows, with_offsets

__all__ = ["RecordElement", "RecordStage"]

_RAW_LIMIT = 4096
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError)


@dataclass(slots=True)
class RecordElement:
    """One record in the operator: where it came from, and its fields (what the user sees)."""

    split_id: int
    offset: int
    row: dict[str, Any]


@dataclass(slots=True)
class _Collected:
    rows: list[dict[str, Any]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    dropped: int = 0


def record_keys(names: tuple[str, ...]) -> Callable[[RecordElement], tuple[Hashable]]:
    """A record's key in key mode: one field's value, or the tuple of several."""
    if len(names) == 1:
        (name,) = names
        return lambda element: (element.row[name],)
    return lambda element: (tuple(element.row[n] for n in names),)


class RecordStage(OperatorStage):
    def __init__(
        self,
        plan: AsyncMapPlan,
        function: AsyncFunction[RecordElement, Completed],
        processor: MailboxProcessor,
        *,
        capacity: int,
        mode: OutputMode,
        key: tuple[str, ...] | None = None,
        timeout: float | None,
        retry: AsyncRetryStrategy = NO_RETRY,
    ) -> None:
        super().__init__(plan)
        self._schema = plan.output_schema()
        self._added = tuple(c.name for c in plan.added)
        self._collected: dict[int, _Collected] = {}
        self._operator = AsyncWaitOperator(
            function,
            Output(self._collect, self._marker, self._flush),
            processor,
            capacity=capacity,
            mode=mode,
            key=None if key is None else record_keys(key),
            timeout=timeout,
            retry=retry,
        )

    def process(self, batch: Batch) -> None:
        rows = user_rows(batch.rows).to_pylist()
        offsets = batch.rows.column(OFFSET).to_pylist()
        self.records_in += len(rows)
        split_id, put = batch.split_id, self._operator.process_element
        for row, offset in zip(rows, offsets, strict=True):
            put(RecordElement(split_id, offset, row))

    # -- operator output -----------------------------------------------------------------

    def _collect(self, completed: Completed, _timestamp: int | None) -> None:
        element: RecordElement = completed.element
        collected = self._collected.get(element.split_id)
        if collected is None:
            collected = self._collected[element.split_id] = _Collected()
        if not completed.results:
            collected.dropped += 1
            return
        for result in completed.results:
            if not isinstance(result, dict):
                raise UserCodeError(
                    self.plan.where,
                    f"a per-record function completes with dicts of its output fields, "
                    f"got {result!r:.60}",
                ).at_record(element.split_id, element.offset)
            unknown = set(result).difference(self._added)
            if unknown:
                raise UserCodeError(
                    self.plan.where,
                    f"returned field(s) {sorted(unknown)} not declared in output (declared: "
                    f"{', '.join(self._added)})",
                ).at_record(element.split_id, element.offset)
            row = dict(element.row)
            for name in self._added:
                row[name] = result.get(name)
            collected.rows.append(row)
            collected.offsets.append(element.offset)

    def _marker(self, marker: Marker) -> None:
        """Records collected before the marker leave before it (re-batched now)."""
        self._flush()
        super()._marker(marker)

    def _flush(self) -> None:
        """Pass the records collected in this run of emissions on, one batch per split."""
        collected, self._collected = self._collected, {}
        for split_id, part in collected.items():
            rows, kept, dead = self._to_arrow(part)
            offsets = part.offsets
            span = (min(offsets), max(offsets) + 1) if offsets else (0, 0)
            batch = Batch(
                split_id,
                with_offsets(rows, kept),
                span,
                only=tuple(sorted(set(offsets))),
                dead=dead,
                dropped=part.dropped,
            )
            self.records_out += batch.rows.num_rows
            self.downstream(batch)

    def _to_arrow(self, part: _Collected) -> tuple[pa.RecordBatch, list[int], list[DeadLetter]]:
        """The collected rows as Arrow, their offsets, and as dead letters the rows whose
        output does not fit its declared type (a function returning a wrong type)."""
        try:
            return pa.RecordBatch.from_pylist(part.rows, schema=self._schema), part.offsets, []
        except _CONVERSION_ERRORS:
            pass
        rows: list[dict[str, Any]] = []
        kept: list[int] = []
        dead: list[DeadLetter] = []
        for row, offset in zip(part.rows, part.offsets, strict=True):
            try:
                pa.RecordBatch.from_pylist([row], schema=self._schema)
            except _CONVERSION_ERRORS as exc:
                raw = orjson.dumps(row, default=str)[:_RAW_LIMIT]
                detail = self._misfit(row, exc)
                dead.append((offset, raw, f"{BAD_VALUE}: {self.plan.where}: {detail}"))
                continue
            rows.append(row)
            kept.append(offset)
        return pa.RecordBatch.from_pylist(rows, schema=self._schema), kept, dead

    def _misfit(self, row: dict[str, Any], error: Exception) -> str:
        """Which field of ``row`` does not fit its declared type, and why (the reason's
        detail); ``error``'s text when no single field is to blame."""
        for column in self._schema:
            value = row.get(column.name)
            try:
                pa.array([value], type=column.type)
            except _CONVERSION_ERRORS as exc:
                shown = repr(value)
                if len(shown) > 60:
                    shown = shown[:59] + "…"
                return (
                    f"field {column.name!r}: {shown} does not fit {type_name(column.type)} ({exc})"
                )
        return str(error)

    # -- chain protocol ------------------------------------------------------------------

    def pending(self) -> Iterator[PendingRange]:
        assert not self._collected, "collected records are flushed after every emission run"
        offsets: dict[int, list[int]] = {}
        for element in self._operator.snapshot():
            if isinstance(element, StreamRecord):
                record: RecordElement = element.value
                offsets.setdefault(record.split_id, []).append(record.offset)
        for split_id, found in offsets.items():
            yield PendingRange(split_id, min(found), max(found) + 1, tuple(sorted(set(found))))
