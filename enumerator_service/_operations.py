"""The platform operations shared by the CLI and Dagster: open, migrate, discover, inspect.

Discovery is described by plain values (:class:`FileDiscovery`, :class:`TableDiscovery`, or
:class:`EnumeratorDiscovery` for a connector that brings its own :class:`SplitEnumerator`):
the pipeline layer above builds them from a pipeline's source, so nothing here knows a
pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._completions import CompletionCounts, completion_counts
from enumerator_service._config import ConfigError, Settings
from enumerator_service._database import (
    connect_engine,
    database_url,
    require_current_schema,
    upgrade_schema,
)
from enumerator_service._enumerator import DiscoveryResult, SplitEnumerator
from enumerator_service._file_enumerators import ContinuousFileEnumerator, StaticFileEnumerator
from enumerator_service._file_identity import ChangePolicy
from enumerator_service._live_state import LiveState, live_state
from enumerator_service._object_landing import StorageError, storage_error
from enumerator_service._quarantine import QuarantinedSplit, quarantined
from enumerator_service._schema import (
    checkpoints,
    dead_letters,
    partition_stats,
    sink_transactions,
)
from enumerator_service._secrets import redact_url
from enumerator_service._split_store import SplitStore
from enumerator_service._storage import Location
from enumerator_service._table_enumerator import TableRangeEnumerator

__all__ = [
    "Discovery",
    "EnumeratorDiscovery",
    "FileDiscovery",
    "Platform",
    "PlatformStatus",
    "TableDiscovery",
    "discover",
    "open_platform",
    "platform_status",
]


@dataclass(frozen=True)
class Platform:
    """A connected platform database: its URL (secret: ``repr`` shows it redacted) and a
    control-path Engine."""

    settings: Settings
    url: str
    engine: Engine

    def __repr__(self) -> str:
        return f"Platform(url={redact_url(self.url)!r}, settings={self.settings!r})"

    def close(self) -> None:
        self.engine.dispose()


@dataclass(frozen=True, slots=True)
class FileDiscovery:
    """Files of source ``source`` in ``landing`` (``dt=YYYY-MM-DD`` folders if
    ``partitioned``, else directly in it): a local folder, or a Location (a local folder or
    a prefix on an object store, see ``_storage``)."""

    source: str
    landing: Path | Location
    partitioned: bool = True


@dataclass(frozen=True, slots=True)
class TableDiscovery:
    """Key ranges of ``schema.table`` (integer ``key``) of about ``rows_per_split`` rows."""

    source: str
    schema: str
    table: str
    key: str
    rows_per_split: int = 100_000


@dataclass(frozen=True, slots=True)
class EnumeratorDiscovery:
    """Splits found by a connector's own enumerator: ``make(engine, settings, dates)`` builds
    the :class:`SplitEnumerator` of one tick — bounded to ``dates`` when given (a backfill),
    else one continuous tick (capped, resumed from its persisted cursor) — whose
    ``discover()`` is the tick."""

    source: str
    make: Callable[[Engine, Settings, Sequence[date] | None], SplitEnumerator]


Discovery = FileDiscovery | TableDiscovery | EnumeratorDiscovery


def open_platform(settings: Settings, *, migrate: bool = True, pool_size: int = 5) -> Platform:
    """Connect to the platform database.

    ``migrate=True`` (only where a platform is set up: ``sluice db upgrade``, ``sluice demo``,
    the start of a run) creates the embedded Postgres if the home has none and applies the
    migrations. ``migrate=False`` (every other command, sensor tick and check) changes
    nothing: no embedded database is created (ConfigError naming ``SLUICE_HOME``) and a schema
    that is not at head is a one-line :class:`SchemaError` saying what to do.
    """
    url = database_url(settings, create=migrate)
    engine = connect_engine(url, pool_size=pool_size)
    try:
        if migrate:
            upgrade_schema(engine)
        else:
            require_current_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return Platform(settings, url, engine)


def discover(
    platform: Platform,
    spec: Discovery,
    *,
    dates: Sequence[date] | None = None,
    wait_settle: bool = False,
) -> DiscoveryResult:
    """One enumerator tick over the source (bounded to ``dates`` when given).

    Without ``dates`` a file tick registers at most ``discovery_max_files_per_tick`` files;
    the result's ``backlog_files`` says how many the next tick will continue with. Files
    changed within ``file_settle_seconds`` are left for a later tick (``unsettled_files``);
    with ``wait_settle`` (a command, not a sensor tick) the tick is repeated after the settle
    time, at most three times, while such files are left.
    """
    result = _discover_once(platform, spec, dates)
    settle = platform.settings.file_settle_seconds
    for _ in range(3 if wait_settle and settle > 0 else 0):
        if not result.unsettled_files or not result.complete:
            break
        time.sleep(settle)  # a command waiting for files still being written
        again = _discover_once(platform, spec, dates)
        registered = result.splits_registered + again.splits_registered
        changed = result.changed_files + again.changed_files
        result = replace(again, splits_registered=registered, changed_files=changed)
    return result


def _discover_once(
    platform: Platform, spec: Discovery, dates: Sequence[date] | None
) -> DiscoveryResult:
    settings = platform.settings
    enumerator: SplitEnumerator
    if isinstance(spec, EnumeratorDiscovery):
        return spec.make(platform.engine, settings, dates).discover()
    if isinstance(spec, TableDiscovery):
        enumerator = TableRangeEnumerator(
            platform.engine,
            spec.source,
            schema=spec.schema,
            table=spec.table,
            key_column=spec.key,
            rows_per_split=spec.rows_per_split,
            lease_seconds=settings.lease_seconds,
        )
        return enumerator.discover()
    landing = spec.landing
    on_store = isinstance(landing, Location) and landing.object_store
    if isinstance(landing, Location) and not on_store:
        landing = landing.local_path
    if isinstance(landing, Path) and not landing.is_dir():
        raise ConfigError(f"{spec.source}: landing", f"folder does not exist: {landing}")
    # (A prefix on a store holding no object yet is no error: files are to come.)
    if dates is not None:
        enumerator = StaticFileEnumerator(
            platform.engine,
            spec.source,
            landing,
            dates=dates,
            lease_seconds=settings.lease_seconds,
            target_split_bytes=settings.target_split_bytes,
            partitioned=spec.partitioned,
            follow_symlinks=settings.follow_symlinks,
            settle_seconds=settings.file_settle_seconds,
            change_policy=ChangePolicy(settings.file_change_policy),
        )
    else:
        # A tick of the sensor must stay short whatever the backlog: capped (a backfill's
        # bounded listing of some dates runs inside its run, not in a tick, and is not).
        enumerator = ContinuousFileEnumerator(
            platform.engine,
            spec.source,
            landing,
            lease_seconds=settings.lease_seconds,
            target_split_bytes=settings.target_split_bytes,
            max_files_per_tick=settings.discovery_max_files_per_tick,
            partitioned=spec.partitioned,
            follow_symlinks=settings.follow_symlinks,
            settle_seconds=settings.file_settle_seconds,
            change_policy=ChangePolicy(settings.file_change_policy),
        )
    if not on_store:
        return enumerator.discover()
    assert isinstance(landing, Location)
    try:
        return enumerator.discover()
    except OSError as exc:  # unreachable, access denied, no such bucket: one line
        error = storage_error(f"{spec.source}: landing {landing.uri}", exc, landing.options)
        raise StorageError(error.setting, f"{error.problem}; nothing was registered") from None


@dataclass(frozen=True)
class PlatformStatus:
    source: str
    splits: dict[str, int]
    rows_committed: int
    rows_dropped: int
    dead_letters: int
    dead_letter_reasons: list[tuple[str, int]]
    last_checkpoint: dict[str, Any] | None
    last_commit_at: datetime | None
    #: Poison splits quarantined as FAILED (oldest first, at most 1000).
    quarantined: list[QuarantinedSplit] = field(default_factory=list)
    #: Watermark, lag, backlog, rows/s at the latest completed checkpoint.
    live: LiveState | None = None
    #: Complete partitions and completions not yet reported to Dagster (None: no table yet).
    completions: CompletionCounts | None = None


def platform_status(platform: Platform, source: str, now: datetime | None = None) -> PlatformStatus:
    """Splits by state, committed rows and dead letters of ``source``, its last checkpoint
    and its live state at ``now`` (default: the clock)."""
    reason = sa.func.split_part(dead_letters.c.reason, ":", 1)
    txn = sink_transactions.c
    # A rebuild's records of other days were counted as dropped; they stay as first written.
    other_days = sa.func.coalesce(txn.partition_counts["detail"]["other_days"].as_integer(), 0)
    # An acknowledgement without partitions stores JSON null (not SQL NULL): both mean the
    # rows of an unpartitioned output (a CDC or table source), counted from the transaction.
    no_partitions = sa.func.coalesce(sa.func.jsonb_typeof(txn.partition_counts), "null") == "null"
    with platform.engine.connect() as conn:
        # Rows of day partitions are counted once in partition_stats, which a replaced day's
        # swap resets to the rebuild's counts (summing the transactions counted its old and
        # new rows); the transactions count the rows of unpartitioned output.
        unpartitioned, dropped, last_commit = conn.execute(
            sa.select(
                sa.func.coalesce(sa.func.sum(txn.row_count).filter(no_partitions), 0),
                sa.func.coalesce(sa.func.sum(txn.dropped_count - other_days), 0),
                sa.func.max(txn.committed_at),
            ).where(txn.committed, txn.source == source)
        ).one()
        partitioned = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(partition_stats.c.rows), 0)).where(
                partition_stats.c.source == source
            )
        ).scalar_one()
        rows = int(unpartitioned) + int(partitioned)
        reasons = conn.execute(
            sa.select(reason, sa.func.count())
            .where(dead_letters.c.source == source)
            .group_by(reason)
            .order_by(sa.func.count().desc())
        ).all()
        last = conn.execute(
            sa.select(checkpoints)
            .where(checkpoints.c.source == source)
            .order_by(checkpoints.c.triggered_at.desc(), checkpoints.c.checkpoint_id.desc())
            .limit(1)
        ).first()
        live = live_state(conn, source, now or datetime.now(UTC))
        completions = completion_counts(conn, source)
    return PlatformStatus(
        source=source,
        splits=SplitStore(platform.engine).counts(source),
        rows_committed=int(rows),
        rows_dropped=int(dropped),
        dead_letters=sum(n for _, n in reasons),
        dead_letter_reasons=[(r, n) for r, n in reasons],
        last_checkpoint=dict(last._mapping) if last is not None else None,
        last_commit_at=last_commit,
        quarantined=quarantined(platform.engine, source),
        live=live,
        completions=completions,
    )
