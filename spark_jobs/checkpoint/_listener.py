"""CheckpointListener: the task side's line to the checkpoint coordinator.

Hears ``trigger`` / ``complete`` / ``abort`` of the run's checkpoints (``LISTEN``) and sends
the subtask's requests for a checkpoint. Notifications are fast but not durable — one sent
while the connection is down is lost — so the listener also re-reads the run's checkpoint
statuses every ``poll_interval`` seconds and after reconnecting: events can repeat, and the
receiver must treat them idempotently (checkpoint ids only grow).

Threading: lives on the task's event loop (the mailbox thread); ``on_event`` is called there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from enumerator_service import CHECKPOINT_CHANNEL, COORDINATOR_CHANNEL, CheckpointStatus

__all__ = ["CheckpointListener"]

_log = logging.getLogger(__name__)
_EVENTS = {
    CheckpointStatus.PENDING: "trigger",
    CheckpointStatus.COMPLETED: "complete",
    CheckpointStatus.ABORTED: "abort",
}
_STATUSES = """
SELECT checkpoint_id, status FROM sluice.checkpoints
WHERE run_id = $1 AND checkpoint_id >= $2 ORDER BY checkpoint_id
"""


class CheckpointListener:
    def __init__(
        self,
        dsn: str,
        run_id: str,
        subtask: int,
        on_event: Callable[[str, int], None],
        *,
        poll_interval: float = 1.0,
    ) -> None:
        self._dsn = dsn
        self._run_id = run_id
        self._subtask = subtask
        self._on_event = on_event
        self._poll_interval = poll_interval
        self._conn: asyncpg.Connection | None = None
        self._poller: asyncio.Task[None] | None = None
        self._since = 0  # statuses of older checkpoints no longer matter to the task
        #: While set, every poll repeats the request (the coordinator may have missed it).
        self.wants_checkpoint = False

    async def open(self) -> None:
        await self._connect()
        await self._resync()
        self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()

    def forget_before(self, checkpoint_id: int) -> None:
        """Resyncs need not report checkpoints older than ``checkpoint_id`` any more."""
        self._since = max(self._since, checkpoint_id)

    def request_checkpoint(self) -> None:
        """Ask the coordinator for a checkpoint now (never blocks; best effort, repeated
        by the poll while ``wants_checkpoint`` is set)."""
        self.wants_checkpoint = True
        asyncio.get_running_loop().create_task(self._send_request())

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self._dsn)
        await conn.add_listener(CHECKPOINT_CHANNEL, self._on_notify)
        self._conn = conn

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if message.get("run") == self._run_id:
            self._on_event(str(message["event"]), int(message["id"]))

    async def _resync(self) -> None:
        assert self._conn is not None
        for checkpoint_id, status in await self._conn.fetch(_STATUSES, self._run_id, self._since):
            self._on_event(_EVENTS[status], int(checkpoint_id))

    async def _send_request(self) -> None:
        conn = self._conn
        if conn is None or conn.is_closed():
            return
        payload = json.dumps({"run": self._run_id, "event": "request", "subtask": self._subtask})
        try:
            await conn.execute("SELECT pg_notify($1, $2)", COORDINATOR_CHANNEL, payload)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            _log.debug("checkpoint request not sent: %s", exc)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                if self._conn is None or self._conn.is_closed():
                    await self._connect()
                await self._resync()
                if self.wants_checkpoint:
                    await self._send_request()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # The database is restarting: try again on the next poll.
                _log.debug("checkpoint listener: %s", exc)
                if self._conn is not None:
                    self._conn.terminate()
                    self._conn = None
