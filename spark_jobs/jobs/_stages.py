"""The operators of a task's chain, one per pipeline step.

``Map`` and ``Filter`` run inline; ``Lookup`` and a per-batch ``AsyncMap`` are an
:class:`~spark_jobs.async_io.AsyncWaitOperator` over batches (its own queue, capacity,
mode, timeout, retries); a per-record ``AsyncMap`` is in ``_record_stage``.

A stage hands each output batch to ``downstream`` (the chain's boundary, which records the
batch's dead letters and dropped count, then feeds the next stage or the sink), and each
``Watermark`` marker to ``downstream_marker``, honouring the async I/O seeds: ``Map`` and
``Filter`` forward a marker after the batches before it (they run inline, so those already
left); an async stage queues it like an element — ordered mode keeps input order, unordered
and key modes treat it as a boundary no record and no marker crosses (event-time unordered;
key mode adds input order per key, a block's keys being the distinct key values of its
records, see :func:`batch_keys`). A stage's
:meth:`Stage.pending` lists the source ranges of everything it holds that was not emitted
yet: that is what a checkpoint stores, and what restore reads again.

Threading: mailbox thread only; nothing here blocks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.async_io import (
    NO_RETRY,
    AsyncFunction,
    AsyncRetryStrategy,
    AsyncWaitOperator,
    Marker,
    Output,
    OutputMode,
    StreamRecord,
    Watermark,
)
from spark_jobs.jobs._results import StepMetrics
from spark_jobs.jobs._user_errors import UserCodeError, first_bad_value
from spark_jobs.jobs._user_functions import Completed
from spark_jobs.lookup import LookupMetrics
from spark_jobs.pipeline._plan import FilterPlan, MapPlan, StagePlan
from spark_jobs.pipeline._types import type_name
from spark_jobs.runtime import MailboxProcessor
from spark_jobs.source._batch import OFFSET, Batch, user_rows, with_offsets

__all__ = [
    "AsyncBatchStage",
    "FilterStage",
    "MapStage",
    "OperatorStage",
    "PendingRange",
    "Stage",
    "as_batch",
    "batch_keys",
    "conform",
]


@dataclass(frozen=True, slots=True)
class PendingRange:
    """Records of split ``split_id`` in ``[start, end)`` not emitted yet: all of them, or
    only those at the offsets ``only`` (records re-batched after a per-record step)."""

    split_id: int
    start: int
    end: int
    only: tuple[int, ...] | None = None


def batch_range(batch: Batch) -> PendingRange:
    return PendingRange(batch.split_id, batch.span[0], batch.span[1], batch.only)


def batch_keys(names: tuple[str, ...]) -> Callable[[Batch], list[Hashable]]:
    """A block's keys in key mode: the distinct values of the ``names`` fields (a tuple of
    them for several) among its records. Null is a key value like any other."""
    if len(names) == 1:
        (name,) = names

        def one(batch: Batch) -> list[Hashable]:
            return pc.unique(batch.rows.column(name)).to_pylist()  # type: ignore[no-any-return]

        return one

    def several(batch: Batch) -> list[Hashable]:
        rows = batch.rows
        return list(set(zip(*(rows.column(n).to_pylist() for n in names), strict=True)))

    return several


def _unconnected(_element: object) -> None:
    raise RuntimeError("stage used before the chain connected it")


class Stage(abc.ABC):
    """One step. ``process`` takes a batch; output goes to ``downstream``."""

    def __init__(self, plan: StagePlan) -> None:
        self.plan = plan
        self.downstream: Callable[[Batch], None] = _unconnected
        self.downstream_marker: Callable[[Watermark], None] = _unconnected
        self.records_in = 0
        self.records_out = 0

    async def open(self) -> None:  # noqa: B027 - an optional hook
        """Acquire clients (on the task's event loop)."""

    async def close(self) -> None:  # noqa: B027 - an optional hook
        """Release them; late results are dropped from now on."""

    @abc.abstractmethod
    def process(self, batch: Batch) -> None:
        """Take ``batch`` (never blocks: a full stage keeps it in its backlog)."""

    def process_marker(self, marker: Watermark) -> None:
        """Take a watermark: an inline stage forwards it at once (every batch before it has
        left already)."""
        self.downstream_marker(marker)

    def has_capacity(self) -> bool:
        return True

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        callback()

    def in_flight(self) -> int:
        return 0

    def notify_when_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def pending(self) -> Iterator[PendingRange]:
        return iter(())

    def metrics(self) -> StepMetrics:
        return StepMetrics(self.plan.index, self.plan.where, self.records_in, self.records_out)


def conform(rows: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """``rows`` with exactly ``schema``'s columns, in order, cast where the type differs; a
    missing field or a value that does not cast is a :class:`UserCodeError` naming the field
    and the row (the first value that does not fit)."""
    columns = []
    for field in schema:
        if field.name not in rows.schema.names:
            raise UserCodeError(where, "the result has no such field", field=field.name)
        column = rows.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                bad = first_bad_value(column, field.type)
                value = "" if bad is None else f" (value {bad[1]})"
                raise UserCodeError(
                    where,
                    f"is {type_name(column.type)}, not {type_name(field.type)}{value}: {exc}",
                    field=field.name,
                    row=None if bad is None else bad[0],
                ) from None
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def as_batch(result: Any, where: str) -> pa.RecordBatch:
    if isinstance(result, pa.Table):
        table = result.combine_chunks()
        batches = table.to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    if not isinstance(result, pa.RecordBatch):
        raise UserCodeError(
            where, f"must return a pyarrow.RecordBatch, got {type(result).__name__}"
        )
    return result


class MapStage(Stage):
    """The user's batch function, one row out per row in."""

    def __init__(self, plan: MapPlan) -> None:
        super().__init__(plan)
        self._function = plan.function
        self._schema = plan.output_schema()
        self._declared = (
            None if plan.declared is None else pa.schema([(c.name, c.type) for c in plan.declared])
        )

    def process(self, batch: Batch) -> None:
        try:
            self._process(batch)
        except UserCodeError as exc:
            exc.at(batch)
            raise

    def _process(self, batch: Batch) -> None:
        rows = batch.rows
        given = user_rows(rows)
        where = self.plan.where
        try:
            returned = self._function(given)
        except (OSError, TimeoutError):
            raise  # a Map calling out (a connection, a timeout): transient, restarted
        except Exception as exc:
            # A Map is a function of its batch: the same records raise again on a retry.
            raise UserCodeError(where, f"raised {type(exc).__name__}: {exc}") from exc
        result = as_batch(returned, where)
        if result.num_rows != given.num_rows:
            raise UserCodeError(
                where,
                f"returned {result.num_rows} rows for {given.num_rows}; a Map keeps "
                "one row per input row (drop rows with a Filter)",
            )
        if self._declared is not None:
            # Declared fields come from the result, every other field from the input.
            merged = {name: given.column(name) for name in given.schema.names}
            for f in self._declared:
                if f.name not in result.schema.names:
                    raise UserCodeError(where, "the result has no such field", field=f.name)
                merged[f.name] = result.column(f.name)
            result = pa.RecordBatch.from_pydict(merged)
        batch.rows = with_offsets(conform(result, self._schema, where), rows.column(OFFSET))
        self.records_in += given.num_rows
        self.records_out += given.num_rows
        self.downstream(batch)


class FilterStage(Stage):
    """Keeps the rows for which the predicate is true."""

    def __init__(self, plan: FilterPlan) -> None:
        super().__init__(plan)
        self._predicate = plan.predicate

    def process(self, batch: Batch) -> None:
        rows = batch.rows
        try:
            kept = rows.filter(self._predicate) if rows.num_rows else rows
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            # The predicate does not fit the records (a field of another type, a dropped one).
            raise UserCodeError(self.plan.where, str(exc)).at(batch) from None
        batch.dropped += rows.num_rows - kept.num_rows
        batch.rows = kept
        self.records_in += rows.num_rows
        self.records_out += kept.num_rows
        self.downstream(batch)


class OperatorStage(Stage):
    """A step run by an async wait operator (``self._operator``): flow control, lifecycle and
    retry/timeout counters are the operator's."""

    _operator: AsyncWaitOperator[Any, Any]
    _lookup_metrics: Callable[[], LookupMetrics] | None = None

    async def open(self) -> None:
        await self._operator.open()

    async def close(self) -> None:
        await self._operator.close()

    def has_capacity(self) -> bool:
        return self._operator.has_capacity()

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        self._operator.notify_when_available(callback)

    def in_flight(self) -> int:
        return self._operator.in_flight()

    def notify_when_drained(self, callback: Callable[[], None]) -> None:
        self._operator.notify_when_drained(callback)

    def process_marker(self, marker: Watermark) -> None:
        """Queued like an element (it takes a slot): see the module docstring for the order."""
        self._operator.process_marker(marker)

    def _marker(self, marker: Marker) -> None:
        """The operator emitted a marker: every element before it has been emitted."""
        if not isinstance(marker, Watermark):
            raise AssertionError(f"unexpected marker {marker!r}")
        self.downstream_marker(marker)

    def metrics(self) -> StepMetrics:
        operator = self._operator
        return StepMetrics(
            self.plan.index,
            self.plan.where,
            self.records_in,
            self.records_out,
            operator.retries,
            operator.timeouts,
            self._lookup_metrics() if self._lookup_metrics is not None else None,
        )


class AsyncBatchStage(OperatorStage):
    """An async wait operator whose element is a batch: a ``Lookup`` (the function returns
    the enriched batch) or a per-batch ``AsyncMap`` (``merge`` turns the user's results into
    the output batch)."""

    def __init__(
        self,
        plan: StagePlan,
        function: AsyncFunction[Batch, Any],
        processor: MailboxProcessor,
        *,
        capacity: int,
        mode: OutputMode,
        key: tuple[str, ...] | None = None,
        timeout: float | None,
        retry: AsyncRetryStrategy = NO_RETRY,
        merge: Callable[[Completed], Batch] | None = None,
        lookup: Callable[[], LookupMetrics] | None = None,
    ) -> None:
        super().__init__(plan)
        self._merge = merge
        self._lookup_metrics = lookup
        self._operator = AsyncWaitOperator(
            function,
            Output(self._collect, self._marker),
            processor,
            capacity=capacity,
            mode=mode,
            key=None if key is None else batch_keys(key),
            timeout=timeout,
            retry=retry,
        )

    def process(self, batch: Batch) -> None:
        self.records_in += batch.rows.num_rows
        self._operator.process_element(batch)

    def _collect(self, result: Any, _timestamp: int | None) -> None:
        if self._merge is None:
            batch: Batch = result
        else:
            try:
                batch = self._merge(result)
            except UserCodeError as exc:
                exc.at(result.element)
                raise
        self.records_out += batch.rows.num_rows
        self.downstream(batch)

    def pending(self) -> Iterator[PendingRange]:
        for element in self._operator.snapshot():
            if isinstance(element, StreamRecord):
                yield batch_range(element.value)
