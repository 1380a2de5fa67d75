"""``bench/e2e.py``: the ceiling rows — the same files without the platform.

No Spark, no checkpoints, no split store: ``CORES`` processes (spawned once, kept for every
round, so only the warm-up pays their start-up), each over every ``CORES``-th file:

- **no lookup**: the file read in blocks of whole lines (``BLOCK_BYTES``, Sluice's default),
  each block parsed by ``pyarrow.json`` against the event schema, rows missing a required
  field dropped, one Parquet file written per input file;
- **lookup**: the same, plus one ``= ANY`` query per block's distinct user ids (asyncpg, one
  prepared statement on one connection per process, one result row of arrays as Sluice's
  lookups query) joined to the block in Arrow.

A block Arrow refuses (a malformed line) is split in halves until the bad lines are alone and
dropped: what a hand-written job has to do too (~85 % of 256 KiB blocks hold one of the
generator's 1-in-1000 malformed lines). The worker functions run in the child processes;
``Ceilings`` is used from the main thread only and its methods block until the run is done.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import shutil
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
from _e2e_common import CORES, USER_COLUMNS, USERS_TABLE, Context, Result

__all__ = ["BLOCK_BYTES", "Ceilings", "line_blocks"]

BLOCK_BYTES = 256 << 10
_UTC = pa.timestamp("us", tz="UTC")
_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.int64()),
        ("event_time", _UTC),
        ("event_type", pa.string()),
        ("amount", pa.float64()),
    ]
)
# Timestamps travel as epoch microseconds (as in Sluice's lookups: cheaper to decode).
_QUERY = (
    "SELECT array_agg(id), array_agg(name), array_agg(country), array_agg(tier), "
    "array_agg((extract(epoch FROM signup_time) * 1000000)::int8) "
    f'FROM public."{USERS_TABLE}" WHERE id = ANY($1::int8[])'
)
_USER_TYPES = (pa.string(), pa.string(), pa.string(), _UTC)


def line_blocks(path: Path, *, header: bool = False) -> Any:
    """Blocks of about ``BLOCK_BYTES`` of whole lines (after the first line when ``header``)."""
    with path.open("rb") as file:
        if header:
            file.readline()
        rest = b""
        while chunk := file.read(BLOCK_BYTES):
            chunk = rest + chunk
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:
                rest = chunk
                continue
            rest = chunk[cut:]
            yield chunk[:cut]
        if rest:
            yield rest + b"\n"


def _parse(block: bytes) -> list[pa.Table]:
    """The block's rows; a block Arrow refuses is halved until its bad lines are alone."""
    options = pj.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore")
    try:
        return [pj.read_json(io.BytesIO(block), parse_options=options)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if block.count(b"\n") <= 1:
            return []  # the malformed line itself (Sluice dead-letters it)
        # Cut after the line end nearest the middle; a block ends with one, so with two lines
        # or more the cut after the first line end always leaves two non-empty halves.
        cut = block.find(b"\n", len(block) // 2) + 1
        if cut == 0 or cut >= len(block):
            cut = block.find(b"\n") + 1
        return _parse(block[:cut]) + _parse(block[cut:])


def _read(block: bytes) -> pa.Table | None:
    """The block's rows with every (required) field present; None if none is left."""
    tables = [t for t in _parse(block) if t.num_rows]
    if not tables:
        return None
    table = (pa.concat_tables(tables) if len(tables) > 1 else tables[0]).drop_null()
    return table if table.num_rows else None


def _join(table: pa.Table, arrays: Any) -> pa.Table:
    """Left join of the block to one result row of arrays (id, name, country, tier, µs)."""
    ids = pa.array(arrays[0] or [], pa.int64())
    where = pc.index_in(table.column("user_id"), value_set=ids)
    for name, values, arrow_type in zip(USER_COLUMNS, arrays[1:], _USER_TYPES, strict=True):
        if arrow_type == _UTC:
            column = pa.array(values or [], pa.int64()).cast(_UTC)
        else:
            column = pa.array(values or [], arrow_type)
        table = table.append_column(f"user_{name}", pc.take(column, where))
    return table


async def _lookup_files(files: list[str], out: str, dsn: str) -> tuple[int, int]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        statement = await conn.prepare(_QUERY)
        rows = queries = 0
        for path in files:
            writer: pq.ParquetWriter | None = None
            try:
                for block in line_blocks(Path(path)):
                    table = _read(block)
                    if table is None:
                        continue
                    keys = pc.unique(table.column("user_id").drop_null()).to_pylist()
                    arrays = await statement.fetchrow(keys)
                    queries += 1
                    table = _join(table, arrays)
                    writer = writer or pq.ParquetWriter(_target(out, path), table.schema)
                    writer.write_table(table)
                    rows += table.num_rows
            finally:
                if writer is not None:
                    writer.close()
        return rows, queries
    finally:
        await conn.close()


def _target(out: str, path: str) -> str:
    return str(Path(out) / f"{Path(path).parent.name}-{Path(path).stem}.parquet")


def plain_job(files: list[str], out: str) -> tuple[int, int]:
    """Child process: read → parse → write Parquet; (rows written, queries = 0). Blocks."""
    Path(out).mkdir(parents=True, exist_ok=True)
    rows = 0
    for path in files:
        writer: pq.ParquetWriter | None = None
        try:
            for block in line_blocks(Path(path)):
                table = _read(block)
                if table is None:
                    continue
                writer = writer or pq.ParquetWriter(_target(out, path), table.schema)
                writer.write_table(table)
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
    return rows, 0


def lookup_job(files: list[str], out: str, dsn: str) -> tuple[int, int]:
    """Child process: read → one ``= ANY`` lookup per block → write; (rows, queries). Blocks."""
    Path(out).mkdir(parents=True, exist_ok=True)
    return asyncio.run(_lookup_files(files, out, dsn))


class Ceilings:
    """The two ceiling jobs over ``ctx.files`` in a pool of ``CORES`` spawned processes.

    Spawned, not forked: the parent runs a JVM and threads. Main thread only; ``run`` blocks.
    """

    def __init__(self, ctx: Context, dsn: str) -> None:
        self._ctx = ctx
        self._dsn = dsn
        self._pool = ProcessPoolExecutor(CORES, mp_context=multiprocessing.get_context("spawn"))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def run(self, lookup: bool) -> Result:
        """One measured run of the no-lookup (``lookup`` False) or the lookup job."""
        from _e2e_procs import timed_run

        ctx = self._ctx
        out = ctx.out_root / f"ceiling-{uuid.uuid4().hex[:8]}"
        shares = [[str(f) for f in ctx.files[i::CORES]] for i in range(CORES)]

        def job() -> list[tuple[int, int]]:
            if lookup:
                futures = [
                    self._pool.submit(lookup_job, share, str(out), self._dsn) for share in shares
                ]
            else:
                futures = [self._pool.submit(plain_job, share, str(out)) for share in shares]
            return [f.result() for f in futures]

        try:
            wall, cpu, memory, done = timed_run(job)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        rows = sum(r for r, _ in done)
        queries = sum(q for _, q in done)
        name = (
            "lookup ceiling: read, = ANY per block (asyncpg), write"
            if lookup
            else "ceiling: read, parse, write (pyarrow), no lookup"
        )
        return Result(
            None,
            "ceiling-lookup" if lookup else "ceiling-plain",
            f"{name}, {CORES} processes",
            ctx.events,
            wall,
            ctx.events / wall,
            cpu,
            memory.worker_mib,
            memory.driver_mib,
            f"{rows:,} rows out" + (f", {queries:,} queries" if lookup else ""),
            postgres_cpu=memory.postgres_cpu,
        )

    def run_orders(self) -> Result:
        """One measured run of the orders ceiling (``_e2e_orders_ceiling``) over the orders
        files: staged by the pool's processes, moved into a fresh target in one transaction."""
        import sqlalchemy as sa
        from _e2e_data import count_lines
        from _e2e_orders_ceiling import OUTPUT, move_sql, orders_job, staging_sql
        from _e2e_pgcpu import breakdown
        from _e2e_procs import timed_run

        ctx = self._ctx
        assert ctx.orders is not None
        files = sorted(str(f) for f in ctx.orders.glob("dt=*/*.csv"))
        shares = [files[i::CORES] for i in range(CORES)]
        name = f"bench_orders_ceiling_{uuid.uuid4().hex[:8]}"
        target, staging = f"public.{name}", f"public.{name}__staged"
        columns = ", ".join(f"{column} {kind}" for column, kind in OUTPUT)
        engine = ctx.platform.engine
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {target} ({columns})"))
            conn.execute(sa.text(staging_sql(staging)))

        def job() -> tuple[int, int, int]:
            futures = [self._pool.submit(orders_job, share, staging, self._dsn) for share in shares]
            done = [f.result() for f in futures]
            with engine.begin() as conn:
                moved = conn.execute(sa.text(move_sql(staging, target))).rowcount
                conn.execute(sa.text(f"DROP TABLE {staging}"))
            return sum(r for r, _ in done), sum(q for _, q in done), moved

        try:
            wall, cpu, memory, (staged, queries, moved) = timed_run(job)
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP TABLE IF EXISTS {target}, {staging}"))
        orders = count_lines([Path(path) for path in files]) - len(files)  # minus headers
        return Result(
            None,
            "ceiling-orders",
            f"orders ceiling: read CSV, 2 lookups, stage, one upsert, {CORES} processes",
            orders,
            wall,
            orders / wall,
            cpu,
            memory.worker_mib,
            memory.driver_mib,
            f"{staged:,} rows staged, {moved:,} upserted, {queries:,} customer queries; "
            f"{breakdown(memory.postgres_cpu_by)}",
            postgres_cpu=memory.postgres_cpu,
        )


def warm_up(ceilings: Ceilings) -> float:
    """One unmeasured run of each job (process start-up, imports, the page cache)."""
    start = time.perf_counter()
    ceilings.run(lookup=False)
    ceilings.run(lookup=True)
    return time.perf_counter() - start
