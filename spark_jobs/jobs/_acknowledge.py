"""A reader subtask's acknowledgement of a checkpoint: its snapshot, the output its sink
staged for it and the interval's counts per output partition, in one database transaction.

Threading: runs on the subtask's sink writer thread (it blocks on the staged output and on
the database), never on the mailbox thread.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from sqlalchemy.engine import Engine

from enumerator_service import Acknowledgement, acknowledge
from spark_jobs.connectors import sink_connector_named
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.sink import StagedOutput, committer

__all__ = ["acknowledge_checkpoint"]


def acknowledge_checkpoint(
    engine: Engine,
    config: TaskConfig,
    subtask: int,
    attempt: str,
    checkpoint_id: int,
    final: bool,
    snapshot: dict[str, Any],
    staged: Future[StagedOutput],
    partitions: dict[str, dict[str, object]],
) -> None:
    """Wait for the staged output of ``checkpoint_id`` and acknowledge it (``final``: the
    subtask's last snapshot). EXACTLY_ONCE: the output stays staged until the checkpoint
    completes (two-phase); AT_LEAST_ONCE: it becomes visible with this acknowledgement."""
    out = staged.result()
    sink = config.plan.sink.kind
    if not config.exactly_once:  # AT_LEAST_ONCE: visible before the offsets commit
        sink_connector_named(sink).publish_unaligned(out.files, config.storage)
    acknowledge(
        engine,
        Acknowledgement(
            run_id=config.run_id,
            checkpoint_id=checkpoint_id,
            subtask=subtask,
            attempt=attempt,
            final=final,
            snapshot=snapshot,
            sink=sink,
            staged=out.files,
            row_count=out.rows,
            dead_letters=out.dead_letters,
            dropped=out.dropped,
            source=config.source,
            partitions=partitions or None,
        ),
        two_phase=config.exactly_once,
        # AT_LEAST_ONCE: table rows become visible with this subtask's split states.
        sink=None if config.exactly_once else committer(sink),
    )
