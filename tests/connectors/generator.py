"""A source connector written outside the platform: deterministic generated events.

This module is what a user writing a connector writes (issue 22, part 5): a spec, a
connector registered for it with :func:`spark_jobs.connectors.register_source`, an
enumerator (a real :class:`~enumerator_service.SplitEnumerator`) and a split reader (a
:class:`~spark_jobs.source.BlockReader`). It uses public names only and changes nothing in
the platform; importing it registers the connector (a pipeline module that uses
:class:`GeneratorSource` imports it, and so does a Spark worker unpickling the task's
pipeline, so this module must be importable on the workers — the repository on their
``PYTHONPATH``).

**The data.** Record ``n`` (``n = 0, 1, …``, ``days * per_day`` records) is an event of day
``first_day + n // per_day``:

- ``event_id`` = ``f"g{seed}-{n:07d}"``;
- ``event_time`` = that day's midnight (UTC) + ``i * step + (n * 7919 + seed) % step``
  microseconds, where ``i = n % per_day`` and ``step = 86_400_000_000 // per_day`` (spread
  over the day, in order up to a jitter within one step);
- ``user_id`` = ``(n * 31 + seed) % 97``, except every ``n % 101 == 100``: null — the field
  is required, so that record is a dead letter (``missing field: user_id``);
- ``event_type`` = ``("view", "click", "purchase")[n % 3]``;
- ``amount`` = ``((n * 7 + seed) % 20_000) / 100 - 50`` (float64; negative ones exist).

**Splits.** Ranges ``[start, end)`` of sequence numbers of at most ``per_split`` records
that never cross a day; the split's ``partition_key`` is its day. In the split store a split
is the row (``kind="generator"``, ``uri="generator://seed-<seed>/dt=<day>"``, start, end,
day): the platform hands it back to the reader as a :class:`~enumerator_service.FileSplit`
with those fields. Offset rule: a record's offset is its sequence number; a block of
``[a, b)`` leaves the split's offset at ``b``, so resuming from a committed offset re-reads
exactly the records after the last committed one.

**Discovery.** Bounded (``dates`` given: a backfill, a Dagster partition): every split of
those days (registration is idempotent). Continuous (one tick): at most
``SLUICE_DISCOVERY_MAX_FILES_PER_TICK`` splits from the cursor on, the cursor — the next
sequence number, one integer — persisted in ``enumerator_state``; the result's
``backlog_files`` counts the splits left for the next tick.

**Reading.** ``rows_per_second`` (optional) paces each reader: a ``fetch`` waits for its
block's time slot on an event that ``wake_up`` sets, so a paced fetch returns early, without
a block and with its position kept, when the fetcher is woken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy.engine import Engine

from enumerator_service import (
    DiscoveryResult,
    EnumeratorDiscovery,
    FileSplit,
    Settings,
    SplitEnumerator,
)
from spark_jobs.connectors import (
    ReaderContext,
    SourceConnector,
    SourceDetails,
    ValidationContext,
    register_source,
)
from spark_jobs.source import ParsedBlock, RecordConverter, RecordSchema, SplitRead

__all__ = [
    "FIELDS",
    "GeneratorConnector",
    "GeneratorEnumerator",
    "GeneratorOptions",
    "GeneratorSource",
    "GeneratorSplitReader",
]

KIND = "generator"
#: The fields every generated record has (the spec's ``schema`` must be exactly these).
FIELDS: Mapping[str, str] = {
    "event_id": "string",
    "user_id": "int64",
    "event_type": "string",
    "amount": "float64",
    "event_time": "timestamp",
}
_TYPES = ("view", "click", "purchase")
_DAY_US = 86_400_000_000


@dataclass(frozen=True)
class GeneratorSource:
    """Generated events of ``days`` days from ``first_day``, ``per_day`` a day, read in
    splits of ``per_split`` (see the module's docstring for the records). Day-partitioned
    by event time; the platform's shared fields (``schema``, ``required``, ``event_time``,
    watermarks, ``late_records``) as for any source."""

    first_day: date | str
    days: int = 2
    per_day: int = 1000
    per_split: int = 250
    seed: int = 7
    rows_per_second: float | None = None
    rows_per_block: int = 100
    schema: Mapping[str, str] = field(default_factory=lambda: dict(FIELDS))
    required: Sequence[str] = ("event_id", "user_id", "event_type", "amount", "event_time")
    event_time: str | None = "event_time"
    out_of_orderness: str = "5s"
    idle_timeout: str = "60s"
    late_records: str = "reopen"


@dataclass(frozen=True, slots=True)
class GeneratorOptions:
    """The validated spec: what the enumerator and the reader need (plain values; travels to
    the tasks as the reader root)."""

    first_day: date
    days: int
    per_day: int
    per_split: int
    seed: int
    rows_per_second: float | None
    rows_per_block: int

    @property
    def total(self) -> int:
        return self.days * self.per_day

    def day_of(self, n: int) -> date:
        return self.first_day + timedelta(days=n // self.per_day)

    def uri(self, day: date) -> str:
        return f"generator://seed-{self.seed}/dt={day.isoformat()}"

    def splits_between(self, source: str, start: int, stop: int) -> list[FileSplit]:
        """The splits covering sequence numbers ``[start, stop)`` (``start`` on a split
        boundary): at most ``per_split`` records, never across a day."""
        found = []
        n = start
        while n < stop:
            day_end = (n // self.per_day + 1) * self.per_day
            end = min(n + self.per_split, day_end, stop)
            day = self.day_of(n)
            found.append(FileSplit(source, KIND, self.uri(day), n, end, day))
            n = end
        return found

    def record(self, n: int) -> tuple[Any, ...]:
        """Record ``n``'s values in :data:`FIELDS` order (``user_id`` None: a dead letter)."""
        step = _DAY_US // self.per_day
        midnight = datetime.combine(self.day_of(n), datetime.min.time(), UTC)
        micros = (n % self.per_day) * step + (n * 7919 + self.seed) % step
        user = None if n % 101 == 100 else (n * 31 + self.seed) % 97
        amount = ((n * 7 + self.seed) % 20_000) / 100 - 50
        return (
            f"g{self.seed}-{n:07d}",
            user,
            _TYPES[n % 3],
            amount,
            midnight + timedelta(microseconds=micros),
        )


def _positive(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def _options(spec: GeneratorSource) -> GeneratorOptions:
    first = spec.first_day
    if isinstance(first, str):
        try:
            first = date.fromisoformat(first)
        except ValueError:
            raise ValueError(f"first_day {spec.first_day!r} is not YYYY-MM-DD") from None
    if not isinstance(first, date):
        raise ValueError(f"first_day must be a date, got {first!r}")
    rate = spec.rows_per_second
    if rate is not None and (not isinstance(rate, int | float) or rate <= 0):
        raise ValueError(f"rows_per_second must be > 0 (or None), got {rate!r}")
    if dict(spec.schema) != dict(FIELDS):
        raise ValueError(f"schema must be the generator's fields {dict(FIELDS)}")
    return GeneratorOptions(
        first,
        _positive(spec.days, "days"),
        _positive(spec.per_day, "per_day"),
        _positive(spec.per_split, "per_split"),
        int(spec.seed),
        None if rate is None else float(rate),
        _positive(spec.rows_per_block, "rows_per_block"),
    )


# --------------------------------------------------------------------------- enumerator


class GeneratorEnumerator(SplitEnumerator):
    """Registers the generator's splits: those of ``dates`` (bounded), or the next
    ``max_splits`` from the persisted cursor (one continuous tick)."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        options: GeneratorOptions,
        *,
        dates: Sequence[date] | None,
        max_splits: int,
        lease_seconds: float = 60.0,
    ) -> None:
        super().__init__(engine, source, lease_seconds=lease_seconds)
        self._options = options
        self._dates = None if dates is None else sorted(set(dates))
        self._max_splits = max_splits

    def cursor(self) -> dict[str, Any]:
        return self.load_cursor({"next": 0})

    def discover(self) -> DiscoveryResult:
        options = self._options
        if self._dates is not None:
            splits = []
            for day in self._dates:
                index = (day - options.first_day).days
                if 0 <= index < options.days:
                    first = index * options.per_day
                    splits += options.splits_between(self.source, first, first + options.per_day)
            added = self.store.register(splits)
            return DiscoveryResult(len(splits), added, self.cursor())
        start = int(self.cursor()["next"])
        left = options.splits_between(self.source, start, options.total)
        splits = left[: self._max_splits]
        added = self.store.register(splits)
        cursor = {"next": splits[-1].end if splits else start}
        self.save_cursor(cursor)
        return DiscoveryResult(len(splits), added, cursor, backlog_files=len(left) - len(splits))


# --------------------------------------------------------------------------- split reader


class GeneratorSplitReader:
    """Computes the records of one read at a time, ``rows_per_block`` per ``fetch``.

    Threading: ``open``/``fetch``/``close`` on the one fetcher thread; ``wake_up`` from any
    thread (a paced ``fetch`` waiting for its slot returns at once, without a block).
    """

    def __init__(self, schema: RecordSchema, options: GeneratorOptions) -> None:
        self._schema = schema
        self._options = options
        self._converter = RecordConverter(schema)
        self._names = list(self._converter.names)
        # The spec's schema is the generator's fields, so declaration order is FIELDS order.
        self._order = [list(FIELDS).index(name) for name in self._names]
        self._wake = threading.Event()
        self._read: SplitRead | None = None
        self._next = 0
        self._stop = 0
        self._due = 0.0

    def open(self, read: SplitRead) -> None:
        split = read.split
        if split.kind != KIND:
            raise TypeError(f"not a generator split: {split!r}")
        self._read = read
        self._next = read.resume
        stop = read.stop_within(split.end)
        self._stop = read.resume if stop is None else stop
        self._due = time.monotonic()

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        read = self._read
        if read is None or self._next >= self._stop:
            self._read = None
            return None, True
        options = self._options
        count = min(options.rows_per_block, self._stop - self._next)
        if options.rows_per_second is not None:
            wait = self._due - time.monotonic()
            if wait > 0 and self._wake.wait(wait):
                self._wake.clear()
                return None, False  # woken: the position is kept for the next fetch
            self._due = max(self._due, time.monotonic()) + count / options.rows_per_second
        start = self._next
        rows: list[tuple[Any, ...]] = []
        offsets: list[int] = []
        dead: list[tuple[int, bytes, str]] = []
        for n in range(start, start + count):
            values = options.record(n)
            ordered = [values[i] for i in self._order]
            parsed = self._converter.from_values(ordered)
            if isinstance(parsed, str):
                raw = dict(zip(self._names, ordered, strict=True))
                dead.append((n, orjson.dumps(raw, default=str), parsed))
            else:
                rows.append(parsed)
                offsets.append(n)
        self._next = start + count
        finished = self._next >= self._stop
        if finished:
            self._read = None
        batch = self._converter.to_batch(rows, offsets)
        block = ParsedBlock(read.split_id, start, self._next, batch, dead, _latest(batch))
        return block, finished

    def wake_up(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._read = None


def _latest(batch: pa.RecordBatch) -> datetime | None:
    if not batch.num_rows:
        return None
    value = pc.max(batch.column("event_time")).as_py()
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# --------------------------------------------------------------------------- connector


class GeneratorConnector(SourceConnector):
    name = "generator"
    split_kinds = (KIND,)

    def validate(self, spec: Any, ctx: ValidationContext) -> SourceDetails:
        options = ctx.check(_options, spec)
        if spec.event_time != "event_time":
            raise ctx.fail("event_time must be 'event_time' (output is partitioned by its day)")
        return SourceDetails(options, partitioned=True, start_date=options.first_day)

    def describe(self, plan: Any, pipeline: str, where: str | None = None) -> str:
        options: GeneratorOptions = plan.options
        return (
            f"generated events, seed {options.seed}: {options.days} days from "
            f"{options.first_day} x {options.per_day} (splits of {options.per_split})"
        )

    def location(self, pipeline: Any, settings: Settings) -> str | None:
        options: GeneratorOptions = pipeline.plan.source.options
        return f"generator://seed-{options.seed}"

    def discovery(self, pipeline: Any, settings: Settings) -> EnumeratorDiscovery:
        options: GeneratorOptions = pipeline.plan.source.options
        source = str(pipeline.name)

        def make(
            engine: Engine, settings: Settings, dates: Sequence[date] | None
        ) -> SplitEnumerator:
            return GeneratorEnumerator(
                engine,
                source,
                options,
                dates=dates,
                max_splits=settings.discovery_max_files_per_tick,
                lease_seconds=settings.lease_seconds,
            )

        return EnumeratorDiscovery(source, make)

    def input_days(self, pipeline: Any, settings: Settings) -> list[date] | None:
        options: GeneratorOptions = pipeline.plan.source.options
        return [options.first_day + timedelta(days=d) for d in range(options.days)]

    def split_reader(self, schema: RecordSchema, context: ReaderContext) -> Any:
        # The validated options travel to the task with the plan (ReaderContext.options).
        if not isinstance(context.options, GeneratorOptions):
            raise TypeError("the generator's split reader needs its options")
        return GeneratorSplitReader(schema, context.options)

    def replay_split(self, split: Any, start: int, end: int) -> Any:
        return split  # the reader computes exactly [start, end) anyway


register_source(GeneratorSource, GeneratorConnector())
