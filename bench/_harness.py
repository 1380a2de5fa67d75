"""Shared pieces of the benchmarks: driving an AsyncWaitOperator over an input iterator, timing,
forgetting a source, one run at a time per Sluice home, and the words of a verdict."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import sqlalchemy as sa

from enumerator_service._schema import checkpoints, enumerator_state, sink_transactions, splits
from spark_jobs.async_io import (
    NO_RETRY,
    AsyncFunction,
    AsyncRetryStrategy,
    AsyncWaitOperator,
    Output,
    OutputMode,
)
from spark_jobs.runtime import MailboxController, MailboxProcessor

__all__ = [
    "clickstream_over",
    "forget_source",
    "one_run_at_a_time",
    "run_operator",
    "timed",
    "verdict",
    "verdict_line",
]

T = TypeVar("T")


_VERDICTS = {None: ("yellow", "n/a"), True: ("green", "ok"), False: ("bold red", "MISS")}


def verdict(ok: bool | None) -> str:
    """A target's verdict in a bench table: ok, MISS, or n/a (not measured)."""
    style, word = _VERDICTS[ok]
    return f"[{style}]{word}[/{style}]"


def verdict_line(ok: bool | None, text: str) -> str:
    """A line of the verdict list under a table: the verdict, padded, then ``text``."""
    style, word = _VERDICTS[ok]
    return f"[{style}]{word:<4}[/{style}] {text}"


async def run_operator(
    function: AsyncFunction[Any, Any],
    inputs: Iterator[Any],
    *,
    capacity: int,
    mode: OutputMode,
    timeout: float | None = None,
    retry: AsyncRetryStrategy = NO_RETRY,
    collect: Callable[[Any, int | None], None] | None = None,
    key: Callable[[Any], Iterable[Hashable]] | None = None,
) -> AsyncWaitOperator[Any, Any]:
    """Feed ``inputs`` through an operator on a fresh mailbox until everything was emitted."""
    sink = collect or (lambda _v, _t: None)

    def default_action(controller: MailboxController) -> None:
        for _ in range(512):
            if not operator.has_capacity():
                operator.notify_when_available(controller.suspend_default_action().resume)
                return
            value = next(inputs, _END)
            if value is _END:
                controller.suspend_default_action()
                operator.notify_when_drained(processor.all_actions_completed)
                return
            operator.process_element(value)

    processor = MailboxProcessor(default_action)
    operator: AsyncWaitOperator[Any, Any] = AsyncWaitOperator(
        function,
        Output(sink, lambda _m: None),
        processor,
        capacity=capacity,
        mode=mode,
        key=key,
        timeout=timeout,
        retry=retry,
    )
    await operator.open()
    await processor.run_loop()
    await operator.close()
    return operator


_END = object()


def one_run_at_a_time(home: Path, bench: str) -> IO[str]:
    """Lock ``<home>/bench/<bench>.lock`` for this process; exits with one line when another
    run of the benchmark holds it. Runs under one Sluice home share their data, tables and
    servers: a second one dropped the first one's CDC table and stopped its source server.
    Keep the returned file open while the run lasts (the lock goes with it, or with the
    process, however it ends)."""
    path = home / "bench" / f"{bench}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise SystemExit(
            f"bench/{bench}.py: another run of it is using {home} ({path} is locked): wait for "
            "it to end, or give this one another SLUICE_HOME"
        ) from None
    return handle


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def drop_sink_tables(engine: sa.Engine, schema: str, tables: Iterable[str]) -> None:
    """Drop Postgres sink tables and the staged batch tables of each (a failed run's)."""
    from spark_jobs.sink import batch_tables

    with engine.begin() as conn:
        for table in tables:
            for name in [table, *batch_tables(conn, schema, table)]:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{schema}"."{name}"'))


def forget_source(engine: sa.Engine, source: str) -> None:
    """Delete a benchmark source's splits, dead letters, cursor, checkpoints and sink
    transactions, so repeated runs leave nothing behind in the platform database."""
    with engine.begin() as conn:
        run_ids = [
            r
            for r in conn.execute(
                sa.select(splits.c.run_id).where(splits.c.source == source).distinct()
            ).scalars()
            if r is not None
        ]
        if run_ids:
            conn.execute(sa.delete(checkpoints).where(checkpoints.c.run_id.in_(run_ids)))
            conn.execute(
                sa.delete(sink_transactions).where(sink_transactions.c.run_id.in_(run_ids))
            )
        conn.execute(sa.delete(splits).where(splits.c.source == source))  # dead letters cascade
        conn.execute(sa.delete(enumerator_state).where(enumerator_state.c.source == source))


def clickstream_over(landing: Any, source: str, users_table: str, cache: Any = None) -> Any:
    """The clickstream example over a benchmark's files (``landing``) and its users table in
    ``public``, named ``source``, its lookup with ``cache`` (default: none)."""
    import dataclasses

    from examples.clickstream import clickstream

    (lookup,) = clickstream.steps
    return dataclasses.replace(
        clickstream,
        name=source,
        source=dataclasses.replace(clickstream.source, landing=landing),
        steps=[dataclasses.replace(lookup, table=f"public.{users_table}", cache=cache)],
    )
