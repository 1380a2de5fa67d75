"""The full cache of :class:`~spark_jobs.lookup.BatchLookup`: the whole table in Arrow.

:func:`load_table` streams the table through a server-side cursor, ``chunk_rows`` rows at a
time, each chunk turned into Arrow arrays at once (the Python rows of one chunk are all that
is ever held); :class:`Reloader` runs a reload every period on the event loop, logging a
failed one (the next period tries again).

Threading: event-loop (mailbox) thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pyarrow as pa

from spark_jobs.lookup._batch_join import Found
from spark_jobs.lookup._batch_sql import LookupShape
from spark_jobs.lookup._connections import ConnectionPool

__all__ = ["LOAD_CHUNK_ROWS", "Reloader", "load_table", "to_found"]

log = logging.getLogger(__name__)

#: Rows fetched (and converted to Arrow) at a time while loading a table.
LOAD_CHUNK_ROWS = 20_000


def to_found(shape: LookupShape, columns: Sequence[Sequence[Any] | None]) -> Found:
    """Arrow arrays of selected ``columns`` (key parts first, then looked-up columns, as the
    shape's statements select them; None: no rows)."""
    keys = tuple(
        pa.array(columns[i] or [], type=part.join_type) for i, part in enumerate(shape.keys)
    )
    offset = len(shape.keys)
    values = tuple(
        pa.array(columns[offset + i] or [], type=column.type)
        for i, column in enumerate(shape.values)
    )
    return Found(keys, values)


async def load_table(
    pool: ConnectionPool, shape: LookupShape, *, chunk_rows: int, timeout: float | None
) -> Found:
    """Every row of the table with a complete key (``shape.load``); ``timeout`` bounds each
    chunk's fetch. A connection whose load failed is discarded."""
    width = len(shape.keys) + len(shape.values)
    parts: list[Found] = []
    conn = pool.try_acquire() or await pool.acquire()
    try:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            cursor = await conn.cursor(shape.load, timeout=timeout)
            while True:
                records = await cursor.fetch(chunk_rows, timeout=timeout)
                if records:
                    parts.append(to_found(shape, list(zip(*records, strict=True))))
                if len(records) < chunk_rows:
                    break
    except BaseException:
        pool.discard(conn)
        raise
    pool.release(conn)
    return Found.concat(parts) if parts else to_found(shape, [None] * width)


class Reloader:
    """Awaits ``reload()`` every ``period`` seconds from :meth:`start` until :meth:`stop`.

    A failed reload is logged and counted in ``failures``; the next period tries again.
    """

    def __init__(self, period: float, reload: Callable[[], Awaitable[None]], what: str) -> None:
        if period <= 0:
            raise ValueError(f"reload period must be positive, got {period}")
        self._period, self._reload, self._what = period, reload, what
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            try:
                await self._reload()
            except Exception:
                self.failures += 1
                log.warning(
                    "reloading %s failed; keeping the loaded table, retrying in %gs",
                    self._what,
                    self._period,
                    exc_info=True,
                )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
