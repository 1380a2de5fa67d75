"""``bench/e2e.py``: the CDC rows — Sluice's ``PostgresCdcSource`` against a bare slot read.

Each round, one fresh orders-like table ``(id bigint primary key, user_id bigint, status text,
qty bigint)`` on the platform database and two fresh pipelines over it, each with its own slot
and publication, both upserting on ``id`` into a ``PostgresSink``: **apply** (the change
stream applied, no step: ``<table>_applied``) and **lookup** (a ``Lookup`` of the bench's
users per change first: ``<table>_out``):

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
from _e2e_common import USERS_TABLE, Context, Result
from _e2e_procs import timed_run
from _e2e_sluice import sluice_settings
from _harness import forget_source, verdict_line

from enumerator_service import Settings
from enumerator_service._operations import Platform, discover

__all__ = ["CdcBench", "cdc_pipeline", "cdc_verdicts", "create_orders", "libpq", "sink_diff"]

SNAPSHOT_ROWS = 20_000
STEP = 1_000  # changes per step: 600 inserts, 300 updates, 100 deletes (3 transactions)
TARGET_CDC_VS_SLOT = 0.5  # Sluice's apply rate over the bare slot read, at least
COLUMNS = "id, user_id, status, qty"
OUT, APPLIED = "_out", "_applied"  # the sink tables of the lookup and the apply pipelines


def libpq(url: Any) -> str:
    """The platform's SQLAlchemy URL as libpq takes it (the password kept, never printed)."""
    if isinstance(url, sa.URL):
        url = url.render_as_string(hide_password=False)
    return str(url).replace("postgresql+psycopg://", "postgresql://", 1)


def cdc_pipeline(name: str, table: str, rows_per_chunk: int, *, lookup: bool = True) -> Any:
    """``table`` into ``<table>_out`` (upsert on id), through a lookup of the bench's users
    unless ``lookup`` is False (then into ``<table>_applied``: the change stream applied)."""
    from spark_jobs import Lookup, Pipeline, PostgresCdcSource, PostgresSink

    steps = [
        Lookup(
            f"public.{USERS_TABLE}",
            on={"user_id": "id"},
            columns={"name": "user_name", "country": "user_country"},
            on_miss="keep",
        )
    ]
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table],
            key="id",
            schema={"id": "int64", "user_id": "int64", "status": "string", "qty": "int64"},
            rows_per_chunk=rows_per_chunk,
        ),
        steps=steps if lookup else [],
        sink=PostgresSink(f"{table}{OUT if lookup else APPLIED}", upsert_key=["id"]),
    )


def create_orders(engine: sa.Engine, table: str, rows: int, users: int) -> None:
    """The table with ``rows`` rows (ids 1..rows, user ids spread over ``users``)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, user_id bigint, status text, "
                "qty bigint)"
            )
        )
        if rows:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, 1 + (g * 7919) % :users, 'new', g % 10 "
                    "FROM generate_series(1, :rows) g"
                ),
                {"rows": rows, "users": users},
            )


def write_changes(url: str, table: str, first_id: int, changes: int, users: int) -> int:
    """Commit about ``changes`` changes in steps of ``STEP`` (inserts of new ids from
    ``first_id``, updates of the previous step's inserts, deletes of the step before's);
    returns the changes committed (row counts of the statements)."""
    import psycopg

    per = STEP // 10
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for step in range(max(1, changes // STEP)):
            low = first_id + step * 6 * per
            cursors = [
                conn.execute(
                    f"INSERT INTO {table} SELECT g, 1 + (g * 7919) %% %s, 'new', g %% 10 "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (users, low, low + 6 * per - 1),
                ),
                # The previous step's inserts that the step before did not delete (3 per).
                conn.execute(
                    f"UPDATE {table} SET status = 'paid', qty = qty + 1 WHERE id BETWEEN %s AND %s",
                    (low - 6 * per + per, low - 6 * per + 4 * per - 1),
                ),
                conn.execute(
                    f"DELETE FROM {table} WHERE id BETWEEN %s AND %s",
                    (low - 12 * per, low - 12 * per + per - 1),
                ),
            ]
            done += sum(max(0, c.rowcount) for c in cursors)
    return done


def sink_diff(engine: sa.Engine, table: str, suffix: str = OUT) -> str:
    """'' when the sink table ``<table><suffix>`` equals ``table`` (and, for the lookup's
    ``_out``, every row with a user was looked up), else what differs — both read here,
    independently of the pipeline."""
    looked_up = "user_name" if suffix == OUT else "''"
    with engine.connect() as conn:
        source = {r[0]: tuple(r) for r in conn.execute(sa.text(f"SELECT {COLUMNS} FROM {table}"))}
        rows = conn.execute(sa.text(f"SELECT {COLUMNS}, {looked_up} FROM {table}{suffix}")).all()
    sink: dict[int, tuple[Any, ...]] = {}
    duplicates = unlooked = 0
    for row in rows:
        duplicates += row[0] in sink
        unlooked += row[4] is None
        sink[row[0]] = tuple(row[:4])
    missing = len(source.keys() - sink.keys())
    extra = len(sink.keys() - source.keys())
    differing = sum(1 for k, v in source.items() if k in sink and sink[k] != v)
    if missing or extra or duplicates or differing or unlooked:
        return (
            f"missing {missing}, extra {extra}, duplicates {duplicates}, differing "
            f"{differing}, not looked up {unlooked} (of {len(source):,} rows)"
        )
    return ""


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
    """The four plans of the CDC rows (see the module docstring), run in order per round."""

    def __init__(self, ctx: Context, changes: int) -> None:
        self.ctx = ctx
        self.changes = changes
        self.engine = ctx.platform.engine
        self.url = libpq(ctx.platform.url)
        self.round: _Round | None = None
        self._drop_leftovers()

    def _drop_leftovers(self) -> None:
        """Inactive slots, publications and tables of CDC benchmark runs that were killed
        (a forgotten slot keeps its WAL on the server's disk for ever)."""
        from spark_jobs.connectors.postgres_cdc import drop_slot

        with self.engine.connect() as conn:
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
            drop_slot(self.engine, slot, slot)
        with self.engine.begin() as conn:
            for table in tables:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS public."{table}"'))

    def plans(self) -> list[tuple[str, Callable[[], Result]]]:
        return [
            (f"cdc: snapshot of {SNAPSHOT_ROWS:,} rows", self.snapshot),
            ("cdc: ceiling, bare slot read (psycopg2)", self.ceiling),
            ("cdc: Sluice stream, Postgres upsert (apply)", self.apply),
            ("cdc: Sluice stream, lookup, Postgres upsert", self.lookup),
        ]

    def _platform(self, settings: Settings) -> Platform:
        return Platform(settings, self.ctx.platform.url, self.engine)

    def _new_round(self) -> _Round:
        table = f"public.bench_cdc_{secrets.token_hex(4)}"
        pipes = {}
        for kind, sink in (("apply", APPLIED), ("lookup", OUT)):
            name = f"{table.removeprefix('public.')}_{kind}"
            pipeline = cdc_pipeline(name, table, SNAPSHOT_ROWS // 4, lookup=kind == "lookup")
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
            create_orders(self.engine, state.table, SNAPSHOT_ROWS, self.ctx.args.users)
            wall, cpu, memory, summary = timed_run(
                lambda: self._discover_and_run(state.pipes["lookup"])
            )
            assert summary.rows_out == SNAPSHOT_ROWS, summary
            other = self._discover_and_run(state.pipes["apply"])  # (not measured)
            assert other.rows_out == SNAPSHOT_ROWS, other
            # The changes, all after both slots' start; then the end of the WAL to read to.
            state.changes = write_changes(
                self.url, state.table, SNAPSHOT_ROWS + 1, self.changes, self.ctx.args.users
            )
            with self.engine.connect() as conn:
                lsn = conn.execute(sa.text("SELECT pg_current_wal_lsn()::text")).scalar_one()
            state.end_lsn = lsn_int(lsn)
        except BaseException:
            self._end(state)
            raise
        return Result(
            None, "cdc-snapshot", f"CDC snapshot ({SNAPSHOT_ROWS:,} rows, 4 chunks)",
            SNAPSHOT_ROWS, wall, SNAPSHOT_ROWS / wall, cpu, memory.worker_mib,
            memory.driver_mib, f"{summary.checkpoints} ckpts; discover + bounded run",
            postgres_cpu=memory.postgres_cpu,
        )  # fmt: skip

    def ceiling(self) -> Result:
        state = self.round
        assert state is not None, "cdc: the snapshot plan runs first"
        options = state.pipes["apply"].pipeline.plan.source.options
        read, wall = read_slot(self.url, options.slot, options.publication, state.end_lsn)
        if read != state.changes:
            self._end(state)
            raise AssertionError(f"the slot held {read:,} changes, {state.changes:,} made")
        return Result(
            None, "cdc-ceiling", "CDC ceiling: bare slot read (psycopg2, pgoutput)", read,
            wall, read / wall, note="change messages counted, no decoding, no feedback",
        )  # fmt: skip

    def _drop(self, state: _Round) -> None:
        """The round's slots, publications, splits, table and sink tables."""
        from spark_jobs.connectors.postgres_cdc import drop_slot

        for pipe in state.pipes.values():
            options = pipe.pipeline.plan.source.options
            drop_slot(self.engine, options.slot, options.publication)
            forget_source(self.engine, pipe.name)
        with self.engine.begin() as conn:
            sinks = [f"{state.table}{p.sink}" for p in state.pipes.values()]
            staged = [f"{sink}__staged" for sink in sinks]  # the Postgres sink's staging
            conn.execute(
                sa.text(f"DROP TABLE IF EXISTS {', '.join([state.table, *sinks, *staged])}")
            )

    def apply(self) -> Result:
        return self._stream("apply", "CDC Sluice: stream -> Postgres upsert (apply)", last=False)

    def lookup(self) -> Result:
        return self._stream("lookup", "CDC Sluice: stream -> lookup -> Postgres upsert", last=True)

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
            diff = sink_diff(self.engine, state.table, pipe.sink)
            assert not diff, f"CDC sink differs from the table: {diff}"
            assert summary.rows_in == state.changes, (summary.rows_in, state.changes)
        except BaseException:
            self._end(state)
            raise
        if last:
            self._end(state)
        queries = f"{summary.lookup_queries:,} queries; " if kind == "lookup" else ""
        return Result(
            None, f"cdc-{kind}", label, state.changes, wall, state.changes / wall, cpu,
            memory.worker_mib, memory.driver_mib,
            f"{summary.checkpoints} ckpts (p50 {summary.checkpoint_p50_ms:.0f} ms), "
            f"{queries}sink == table (checked)",
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
    return [
        verdict_line(
            ratio >= TARGET_CDC_VS_SLOT,
            f"CDC: {applied.events:,} changes applied at {applied.rate:,.0f}/s = {ratio:.2f}x a "
            f"bare read of the same slot ({ceiling.rate:,.0f}/s; target >= "
            f"{TARGET_CDC_VS_SLOT:g}x; medians of this invocation){with_lookup}",
        )
    ]
