"""The reader job's driver: assign splits to a run, run the subtasks on Spark, report.

The driver holds the run's leases (a heartbeat thread renews them), runs the checkpoint
coordinator while the subtasks run, and returns whatever the run did not commit to the pool
when it ends, successfully or not.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from enumerator_service import (
    CheckpointCoordinator,
    CheckpointStore,
    ConfigError,
    Settings,
    SplitStore,
    TransactionalSink,
    asyncpg_dsn,
    connect_engine,
    database_url,
    recover,
)
from enumerator_service._rebuilds import RebuildStore
from enumerator_service._schema import dead_letters, sink_transactions, splits
from spark_jobs._spark import get_spark
from spark_jobs.jobs._subtask import run_reader_subtask
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.sink import (
    SINK_NAME,
    TABLE_SINK_NAME,
    build_sinks,
    ensure_tables,
    finish_rebuilds,
    sweep_staged,
)

__all__ = ["RunSummary", "run_enrichment"]

_log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]
_T = TypeVar("_T")


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    splits: int
    rows_in: int
    rows_out: int
    dead_letters: int
    fenced: int
    seconds: float
    rows_per_second: float
    nothing_new: bool
    lookups: int = 0
    lookup_queries: int = 0
    cache_hit_rate: float = 0.0
    lookup_p50_ms: float = 0.0
    lookup_p99_ms: float = 0.0
    checkpoints: int = 0
    checkpoints_aborted: int = 0
    checkpoint_p50_ms: float = 0.0
    checkpoint_p99_ms: float = 0.0
    alignment_p50_ms: float = 0.0
    #: Partitions (ISO dates) whose output this run replaced.
    rebuilt: tuple[str, ...] = ()


def _subtask_partition(config: TaskConfig, index: int, _rows: Iterator[Any]) -> Iterator[Any]:
    yield run_reader_subtask(config, index)


class _Heartbeat(threading.Thread):
    """Renews the run's leases and reports progress until stopped."""

    def __init__(
        self,
        store: SplitStore,
        engine: sa.Engine,
        run_id: str,
        lease: float,
        progress: Progress | None,
        finish_rebuilds: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(name="sluice-heartbeat", daemon=True)
        self._store, self._engine, self._run_id = store, engine, run_id
        self._lease, self._progress = lease, progress
        self._finish_rebuilds = finish_rebuilds
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_renewal = last_finish = time.monotonic()
        while not self._stop_event.wait(0.5):
            try:
                if time.monotonic() - last_renewal >= self._lease / 3:
                    self._store.heartbeat_run(self._run_id, self._lease)
                    last_renewal = time.monotonic()
                # A long-running reader may complete a rebuild's last members (its own run
                # died): swap it in without waiting for the reader to end.
                if self._finish_rebuilds is not None and time.monotonic() - last_finish >= 10:
                    last_finish = time.monotonic()
                    self._finish_rebuilds()
                if self._progress is not None:
                    self._progress(*_run_progress(self._engine, self._run_id))
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                # Postgres restarting: renew on the next beat (a lease is lease/3 ahead).
                _log.warning("lease heartbeat failed: %s", exc)
            except Exception:
                # Never let a failed swap stop the lease renewals; the next call retries it.
                _log.exception("finishing partition rebuilds failed")

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def _run_progress(engine: sa.Engine, run_id: str) -> tuple[int, int]:
    with engine.connect() as conn:
        done, total = conn.execute(
            sa.select(
                sa.func.count().filter(splits.c.status == "COMPLETED"), sa.func.count()
            ).where(splits.c.run_id == run_id)
        ).one()
    return int(done), int(total)


def _clean_staging(engine: sa.Engine, staging: Path) -> None:
    """Delete staged files of runs that hold no split any more (aborted pre-commits)."""
    if not staging.is_dir():
        return
    with engine.connect() as conn:
        live = set(
            conn.execute(
                sa.select(splits.c.run_id)
                .where(splits.c.status.in_(("ASSIGNED", "READING")))
                .distinct()
            ).scalars()
        )
    for folder in staging.iterdir():
        if folder.is_dir() and folder.name not in live:
            shutil.rmtree(folder, ignore_errors=True)


def run_enrichment(
    settings: Settings,
    *,
    dates: Sequence[date] | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
    continuous: bool = False,
    rebuild: bool = False,
) -> RunSummary:
    """Assign the unassigned splits (of ``dates`` if given) to a new run and process them.

    ``continuous``: a long-running reader — its subtasks keep pulling splits that are
    assigned to ``run_id`` later (by the enumerator sensor) and end only after
    ``continuous_idle_seconds`` without new work (0: when the run is cancelled).

    ``rebuild`` (with ``dates``): the days that were processed before are read again from
    scratch and their output replaces the previous output in one swap at the end (see
    ``enumerator_service._rebuilds``); days never processed are simply processed.
    """
    if rebuild and dates is None:
        raise ValueError("a rebuild needs the dates to rebuild")
    if rebuild and settings.sink != SINK_NAME:
        raise ConfigError("SLUICE_SINK", "re-materialising processed partitions needs 'parquet'")
    started = time.monotonic()
    run_id = run_id or f"run-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    url = database_url(settings)
    engine = connect_engine(url)
    store = SplitStore(engine)
    source = settings.source_name
    output_root = settings.output_path
    # Outside the table folder, so no reader of the table ever sees staged files.
    staging_root = settings.warehouse_path / "_staging" / output_root.name
    try:
        # Recovery first: return dead runs' leases, publish output committed but not yet
        # published, abort what dead runs staged.
        store.release_expired(source)
        sinks = build_sinks(engine)
        recover(engine, sinks)
        _clean_staging(engine, staging_root)
        finish = functools.partial(finish_rebuilds, engine, output_root, sinks, source=source)
        finish()  # rebuilds a crash interrupted
        if settings.sink == TABLE_SINK_NAME:
            ensure_tables(engine, settings.sink_schema, settings.sink_table)
            sweep_staged(engine, settings.sink_schema, settings.sink_table)
        rebuilds = RebuildStore(engine)
        # Rebuilt days: every split is assigned to this run again, as a rebuild member.
        replacing = (
            rebuilds.start(source, dates or [], run_id, lease_seconds=settings.lease_seconds)
            if rebuild
            else []
        )
        assigned = rebuilds.unfinished_members([r.id for r in replacing])
        assigned += store.assign_to_run(
            run_id, source, lease_seconds=settings.lease_seconds, partition_keys=dates
        )
        if continuous and settings.checkpoint_interval_seconds == 0:
            raise ConfigError(
                "SLUICE_CHECKPOINT_INTERVAL_SECONDS", "must be > 0 for a continuous reader run"
            )
        if assigned == 0 and not continuous:
            return RunSummary(run_id, 0, 0, 0, 0, 0, time.monotonic() - started, 0.0, True)
        config = TaskConfig(
            database_url=url,
            asyncpg_dsn=asyncpg_dsn(url),
            run_id=run_id,
            lease_seconds=settings.lease_seconds,
            output_root=str(output_root),
            staging_root=str(staging_root),
            lookup_schema=settings.lookup_schema,
            lookup_table=settings.lookup_table,
            lookup_key=settings.lookup_key,
            capacity=settings.lookup_capacity,
            batch_size=settings.lookup_batch_size,
            pool_size=settings.lookup_pool_size,
            max_line_bytes=settings.max_line_bytes,
            block_bytes=settings.read_block_bytes,
            timeout_seconds=settings.lookup_timeout_seconds,
            retries=settings.lookup_retries,
            max_linger_ms=settings.lookup_max_linger_ms,
            cache_rows=settings.lookup_cache_rows,
            cache_ttl_seconds=settings.lookup_cache_ttl_seconds,
            injected_latency_ms=settings.lookup_injected_latency_ms,
            exactly_once=settings.checkpointing_mode == "EXACTLY_ONCE",
            sink=settings.sink,
            sink_schema=settings.sink_schema,
            sink_table=settings.sink_table,
            continuous=continuous,
            continuous_poll_seconds=settings.continuous_poll_seconds,
            continuous_idle_seconds=settings.continuous_idle_seconds or None,
        )
        parallelism = settings.parallelism if continuous else min(settings.parallelism, assigned)
        heartbeat = _Heartbeat(
            store, engine, run_id, settings.lease_seconds, progress, finish if continuous else None
        )
        spark = get_spark(settings.spark_master, driver_host=settings.spark_driver_host)
        coordinator = CheckpointCoordinator(
            engine,
            run_id,
            parallelism,
            sinks,
            interval=settings.checkpoint_interval_seconds,
            timeout=settings.checkpoint_timeout_seconds,
            exactly_once=config.exactly_once,
            # Subtasks wait for their final checkpoint: without a coordinator, stop the job.
            on_failure=lambda _exc: spark.sparkContext.cancelAllJobs(),
        )
        heartbeat.start()
        coordinator.start()
        try:
            results: list[dict[str, Any]] = (
                spark.sparkContext.parallelize(range(parallelism), parallelism)
                .mapPartitionsWithIndex(functools.partial(_subtask_partition, config))
                .collect()
            )
        except BaseException:
            # Interrupted (a cancelled Dagster run, Ctrl-C) or failed: stop the subtasks too —
            # a continuous reader would otherwise keep running without its driver's leases.
            spark.sparkContext.cancelAllJobs()
            raise
        finally:
            coordinator.stop()
            heartbeat.stop()
            _give_back(store, engine, run_id, sinks)
        if coordinator.error is not None:
            raise RuntimeError("checkpoint coordinator failed") from coordinator.error
        # The run's work is committed: a Postgres restart now delays the wrap-up, no more.
        if progress is not None:
            progress(*_while_down(lambda: _run_progress(engine, run_id)))
        _while_down(lambda: recover(engine, sinks))  # publishes what is committed, unpublished
        shutil.rmtree(staging_root / run_id, ignore_errors=True)
        _while_down(finish)
        pending = {r.id for r in _while_down(lambda: rebuilds.pending(source))}
        unfinished = [r for r in replacing if r.id in pending]
        if unfinished:
            raise RuntimeError(
                f"rebuild of partition {unfinished[0].partition_key} is not complete "
                f"({rebuilds.unfinished_members([unfinished[0].id])} of its splits uncommitted); "
                "the previous output stays live: materialise it again"
            )
        if settings.sink == TABLE_SINK_NAME:
            sweep_staged(engine, settings.sink_schema, settings.sink_table)
        stats = coordinator.stats
        # From Postgres, not from task results: a retried task's earlier commits count too.
        committed, rows_out, dead = _while_down(lambda: _run_totals(engine, run_id))
        seconds = time.monotonic() - started
        return RunSummary(
            run_id=run_id,
            splits=committed,
            rows_in=rows_out + dead,
            rows_out=rows_out,
            dead_letters=dead,
            fenced=sum(1 for _, reason in stats.aborted if reason.startswith("fenced")),
            seconds=seconds,
            rows_per_second=(rows_out + dead) / seconds if seconds > 0 else 0.0,
            nothing_new=False,
            checkpoints=len(stats.completed),
            checkpoints_aborted=len(stats.aborted),
            checkpoint_p50_ms=_quantile([c.duration for c in stats.completed], 0.5) * 1e3,
            checkpoint_p99_ms=_quantile([c.duration for c in stats.completed], 0.99) * 1e3,
            alignment_p50_ms=_quantile([c.alignment for c in stats.completed], 0.5) * 1e3,
            rebuilt=tuple(r.partition_key.isoformat() for r in replacing),
            **_lookup_totals(results),
        )
    finally:
        engine.dispose()


def _while_down(step: Callable[[], _T], patience: float = 60.0) -> _T:
    """``step``, retried while the database is unreachable (a restart), for ``patience`` s."""
    deadline = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            return step()
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            if time.monotonic() + delay > deadline:
                raise
            _log.warning("database unavailable, retrying in %.1fs: %s", delay, exc)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _give_back(
    store: SplitStore, engine: sa.Engine, run_id: str, sinks: dict[str, TransactionalSink]
) -> None:
    """Whatever the run did not commit goes back to the pool (addSplitsBack), and its staged
    leftovers are aborted. With the database down this fails — logged, not raised, so the
    run's own error stays visible; lease expiry and recovery do the same work later."""
    try:
        store.release_run(run_id)
        CheckpointStore(engine, run_id, sinks).abort_uncommitted()
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        _log.warning("run %s: splits not returned now (lease expiry will): %s", run_id, exc)


def _lookup_totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Lookup metrics over the subtasks (latency quantiles: the worst subtask's)."""
    lookups = sum(r["lookups"] for r in results)
    return {
        "lookups": lookups,
        "lookup_queries": sum(r["lookup_batches"] for r in results),
        "cache_hit_rate": sum(r["cache_hits"] for r in results) / lookups if lookups else 0.0,
        "lookup_p50_ms": max((r["lookup_p50_ms"] for r in results), default=0.0),
        "lookup_p99_ms": max((r["lookup_p99_ms"] for r in results), default=0.0),
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run_totals(engine: sa.Engine, run_id: str) -> tuple[int, int, int]:
    """Splits completed, rows committed and dead letters recorded by the run."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(sink_transactions.c.row_count), 0)).where(
                sink_transactions.c.run_id == run_id, sink_transactions.c.committed
            )
        ).scalar_one()
        splits_done = conn.execute(
            sa.select(sa.func.count()).where(
                splits.c.run_id == run_id, splits.c.status == "COMPLETED"
            )
        ).scalar_one()
        dead = conn.execute(
            sa.select(sa.func.count()).where(dead_letters.c.run_id == run_id)
        ).scalar_one()
    return int(splits_done), int(rows), int(dead)
