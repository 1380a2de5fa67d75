"""``bench/e2e.py``: the CDC rows — Sluice's ``PostgresCdcSource`` against a bare slot read.

Each round, one fresh orders-like table ``(id bigint primary key, user_id bigint, status text,
qty bigint)`` in the ``CdcSource``'s database (``_e2e_cdc_source``: a server of its own, read
with ``url_env``, for the target rows; the platform database for the informational row) and
fresh pipelines over it, each with its own slot and publication, upserting on ``id`` into a
``PostgresSink`` in the platform database: **apply** (the change stream applied, no step:
``<table>_applied``) and **lookup** (a ``Lookup`` of the bench's users per change first:
``<table>_out``; not in the informational row):

1. **snapshot** (label ``cdc: snapshot``): the table holds ``SNAPSHOT_ROWS`` rows; discovery
   creates each pipeline's slot and chunks, a bounded run reads them (rate = rows / wall s of
   the lookup pipeline's discover + run; informational). Then ``--cdc-changes`` changes are
   committed in transactions of ``STEP`` changes (60 % inserts of new keys, 30 % updates of
   earlier inserts, 10 % deletes), all after both slots exist; the end LSN is taken after
   the last.
2. **ceiling** (``cdc: ceiling``): ``read_slot`` — psycopg2's replication connection, the
   same plugin and publication, counting the change messages of the apply pipeline's slot to
   the end LSN, no feedback (the slot stays where it was). Its count must equal the changes
   committed.
3. **apply** (``cdc: Sluice stream, Postgres upsert``) then **lookup**: discovery registers
   the pipeline's stream split, a bounded run reads its slot to the WAL position at its
   start: rate = changes / wall s of discover + run. The sink must equal the table afterwards
   (missing, extra, duplicate and differing keys all 0; read independently of the pipeline;
   for the lookup, every surviving row looked up). After the lookup run the slots, the
   publications, the splits and the tables are dropped.

The target (``TARGET_CDC_VS_SLOT``) is the apply row's: the rate at which changes reach the
upsert sink. The lookup row's ratio is printed beside it (each change then also costs a key
in a batched query of a 1M-row table). ``--cdc-changes`` defaults to 1,000,000 so that the
rate is the stream's, not the ~1 s a bounded run takes to start and end (a 50,000-change run
is mostly that).

Threading: everything here runs on the benchmark's main thread, one step after another; the
three plans of a round must run in this order (the state of a round passes between them).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from _e2e_cdc_ceiling import lsn_int, read_slot
from _e2e_cdc_source import CdcSource
from _e2e_cdc_tables import APPLIED, OUT, cdc_pipeline, create_orders, sink_diff, write_changes
from _e2e_common import Context, Result
from _e2e_procs import timed_run
from _e2e_sluice import cpu_breakdown, sluice_settings
from _harness import drop_sink_tables, forget_source, verdict_line

from enumerator_service import Settings
from enumerator_service._operations import Platform, discover

__all__ = ["CdcBench", "cdc_verdicts"]

SNAPSHOT_ROWS = 20_000
TARGET_CDC_VS_SLOT = 0.5  # Sluice's apply rate over the bare slot read, at least


@dataclasses.dataclass
class _Pipe:
    """One of a round's two pipelines over its table, each with its own slot."""

    name: str
    pipeline: Any
    settings: Settings
    sink: str


@dataclasses.dataclass
class _Round:
    table: str
    pipes: dict[str, _Pipe]  # "apply" (no step) and "lookup"
    changes: int = 0
    end_lsn: int = 0


class CdcBench:
    """The plans of the CDC rows (see the module docstring), run in order per round, over
    tables in ``source``'s database; ``kinds``: the pipelines ("apply", "lookup")."""

    def __init__(
        self,
        ctx: Context,
        changes: int,
        source: CdcSource,
        kinds: tuple[str, ...] = ("apply", "lookup"),
    ) -> None:
        self.ctx = ctx
        self.changes = changes
        self.engine = ctx.platform.engine  # the splits, the sinks
        self.source = source  # the tables, slots and publications
        self.kinds = kinds
        self.round: _Round | None = None
        self._drop_leftovers()

    def _drop_leftovers(self) -> None:
        """Inactive slots, publications and tables of CDC benchmark runs that were killed
        (a forgotten slot keeps its WAL on the server's disk for ever)."""
        from spark_jobs.connectors.postgres_cdc import drop_slot

        with self.source.engine.connect() as conn:
            slots = (
                conn.execute(
                    sa.text(
                        "SELECT slot_name FROM pg_replication_slots WHERE NOT active "
                        "AND slot_name LIKE 'sluice\\_bench\\_cdc%'"
                    )
                )
                .scalars()
                .all()
            )
            tables = (
                conn.execute(
                    sa.text(
                        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                        "AND tablename LIKE 'bench\\_cdc%'"
                    )
                )
                .scalars()
                .all()
            )
        for slot in slots:
            drop_slot(self.source.engine, slot, slot)
        for engine in {self.source.engine, self.engine}:
            with engine.begin() as conn:
                for table in tables:
                    conn.execute(sa.text(f'DROP TABLE IF EXISTS public."{table}"'))

    def plans(self) -> list[tuple[str, Callable[[], Result]]]:
        tag = self.source.label
        streams = {
            "apply": (f"cdc{tag}: Sluice stream, Postgres upsert (apply)", self.apply),
            "lookup": (f"cdc{tag}: Sluice stream, lookup, Postgres upsert", self.lookup),
        }
        return [
            (f"cdc{tag}: snapshot of {SNAPSHOT_ROWS:,} rows", self.snapshot),
            (f"cdc{tag}: ceiling, bare slot read (psycopg2)", self.ceiling),
            *(streams[kind] for kind in self.kinds),
        ]

    def _platform(self, settings: Settings) -> Platform:
        return Platform(settings, self.ctx.platform.url, self.engine)

    def _new_round(self) -> _Round:
        table = f"public.bench_cdc_{secrets.token_hex(4)}"
        pipes = {}
        for kind, sink in (("apply", APPLIED), ("lookup", OUT)):
            if kind not in self.kinds:
                continue
            name = f"{table.removeprefix('public.')}_{kind}"
            pipeline = cdc_pipeline(
                name,
                table,
                SNAPSHOT_ROWS // 4,
                lookup=kind == "lookup",
                url_env=self.source.url_env,
            )
            pipes[kind] = _Pipe(name, pipeline, sluice_settings(self.ctx, 0.0, name), sink)
        return _Round(table, pipes)

    def _discover_and_run(self, pipe: _Pipe, *, stream: bool = False) -> Any:
        """Discovery, then a bounded run of ``pipe``; ``stream``: discovery must register
        the stream split (the snapshot's chunks were read before)."""
        from spark_jobs.jobs import run_pipeline
        from spark_jobs.pipeline._paths import discovery_of

        found = discover(self._platform(pipe.settings), discovery_of(pipe.pipeline, pipe.settings))
        if stream:
            assert found.splits_registered == 1, "no stream split registered"
        return run_pipeline(pipe.settings, pipe.pipeline)

    def _end(self, state: _Round) -> None:
        """The round is over (its last plan ran, or one failed): its state dropped."""
        self.round = None
        self._drop(state)

    def snapshot(self) -> Result:
        self.round = state = self._new_round()
        try:
            create_orders(self.source.engine, state.table, SNAPSHOT_ROWS, self.ctx.args.users)
            first, *others = [state.pipes[kind] for kind in reversed(self.kinds)]
            wall, cpu, memory, summary = timed_run(lambda: self._discover_and_run(first))
            assert summary.rows_out == SNAPSHOT_ROWS, summary
            for other in others:  # (not measured)
                done = self._discover_and_run(other)
                assert done.rows_out == SNAPSHOT_ROWS, done
            # The changes, all after every slot's start; then the end of the WAL to read to.
            state.changes = write_changes(
                self.source.url, state.table, SNAPSHOT_ROWS + 1, self.changes, self.ctx.args.users
            )
            with self.source.engine.connect() as conn:
                lsn = conn.execute(sa.text("SELECT pg_current_wal_lsn()::text")).scalar_one()
            state.end_lsn = lsn_int(lsn)
        except BaseException:
            self._end(state)
            raise
        return Result(
            None, f"{self.source.kind}-snapshot",
            f"CDC snapshot ({SNAPSHOT_ROWS:,} rows, 4 chunks)", SNAPSHOT_ROWS, wall,
            SNAPSHOT_ROWS / wall, cpu, memory.worker_mib, memory.driver_mib,
            f"{summary.checkpoints} ckpts; discover + bounded run",
            postgres_cpu=memory.postgres_cpu,
        )  # fmt: skip

    def ceiling(self) -> Result:
        state = self.round
        assert state is not None, "cdc: the snapshot plan runs first"
        options = state.pipes[self.kinds[0]].pipeline.plan.source.options
        read, wall = read_slot(self.source.url, options.slot, options.publication, state.end_lsn)
        if read != state.changes:
            self._end(state)
            raise AssertionError(f"the slot held {read:,} changes, {state.changes:,} made")
        return Result(
            None, f"{self.source.kind}-ceiling",
            f"CDC ceiling: bare slot read (psycopg2, pgoutput){self.source.label}", read,
            wall, read / wall, note="change messages counted, no decoding, no feedback",
        )  # fmt: skip

    def _drop(self, state: _Round) -> None:
        """The round's slots, publications, splits, table and sink tables."""
        from spark_jobs.connectors.postgres_cdc import drop_slot

        for pipe in state.pipes.values():
            options = pipe.pipeline.plan.source.options
            drop_slot(self.source.engine, options.slot, options.publication)
            forget_source(self.engine, pipe.name)
        with self.source.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {state.table}"))
        sinks = [f"{state.table}{p.sink}" for p in state.pipes.values()]
        drop_sink_tables(self.engine, "public", sinks)

    def apply(self) -> Result:
        label = f"CDC Sluice: stream -> Postgres upsert (apply){self.source.label}"
        return self._stream("apply", label, last=self.kinds[-1] == "apply")

    def lookup(self) -> Result:
        label = f"CDC Sluice: stream -> lookup -> Postgres upsert{self.source.label}"
        return self._stream("lookup", label, last=self.kinds[-1] == "lookup")

    def _stream(self, kind: str, label: str, *, last: bool) -> Result:
        """Discover + a bounded run of the round's ``kind`` pipeline over the changes; the
        round is dropped after the ``last`` one (or on a failure)."""
        state = self.round
        assert state is not None, "cdc: the snapshot plan runs first"
        pipe = state.pipes[kind]
        try:
            wall, cpu, memory, summary = timed_run(
                lambda: self._discover_and_run(pipe, stream=True)
            )
            diff = sink_diff(self.source.engine, state.table, pipe.sink, self.engine)
            assert not diff, f"CDC sink differs from the table: {diff}"
            assert summary.rows_in == state.changes, (summary.rows_in, state.changes)
        except BaseException:
            self._end(state)
            raise
        if last:
            self._end(state)
        queries = f"{summary.lookup_queries:,} queries; " if kind == "lookup" else ""
        return Result(
            None, f"{self.source.kind}-{kind}", label, state.changes, wall,
            state.changes / wall, cpu, memory.worker_mib, memory.driver_mib,
            f"{summary.checkpoints} ckpts (p50 {summary.checkpoint_p50_ms:.0f} ms), "
            f"{queries}sink == table (checked); {cpu_breakdown(memory.cpu_by)}",
            postgres_cpu=memory.postgres_cpu, checkpoint_p50_ms=summary.checkpoint_p50_ms,
        )  # fmt: skip


def cdc_verdicts(results: list[Result]) -> list[str]:
    """The apply row against the bare read (the target); the lookup row's ratio beside it."""
    by_kind = {r.kind: r for r in results if r.kind.startswith("cdc-")}
    ceiling, applied = by_kind.get("cdc-ceiling"), by_kind.get("cdc-apply")
    if applied is None or ceiling is None:
        return [verdict_line(None, "CDC apply rate vs a bare slot read (not measured)")]
    ratio = applied.rate / ceiling.rate
    looked = by_kind.get("cdc-lookup")
    with_lookup = (
        f"; with a lookup per change {looked.rate:,.0f}/s = {looked.rate / ceiling.rate:.2f}x"
        if looked is not None
        else ""
    )
    same, its_ceiling = by_kind.get("cdc-platform-apply"), by_kind.get("cdc-platform-ceiling")
    if same is not None and its_ceiling is not None:
        with_lookup += (
            f"; with the table in the platform database {same.rate:,.0f}/s ="
            f" {same.rate / its_ceiling.rate:.2f}x its slot's bare read"
            f" ({its_ceiling.rate:,.0f}/s)"
        )
    return [
        verdict_line(
            ratio >= TARGET_CDC_VS_SLOT,
            f"CDC: {applied.events:,} changes of a table on its own server applied at"
            f" {applied.rate:,.0f}/s = {ratio:.2f}x a bare read of the same slot"
            f" ({ceiling.rate:,.0f}/s; target >= {TARGET_CDC_VS_SLOT:g}x; medians of this"
            f" invocation){with_lookup}",
        )
    ]
