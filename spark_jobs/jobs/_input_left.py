"""What a run did not read in its scope, and why: quarantined splits (poison files, files
refused because they changed), splits held elsewhere (by another live run, or waiting for a
rebuild of their day), and splits whose attempt failed on their own content and that went back
to the pool (the next run tries them again, up to ``SLUICE_SPLIT_MAX_ATTEMPTS``). The summary
and the exit code name them, so a run never says "nothing new" while input waits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

import sqlalchemy as sa

from enumerator_service import QuarantinedSplit, SplitStatus, quarantined, splits

__all__ = ["InputLeft", "input_left"]


@dataclass(frozen=True, slots=True)
class InputLeft:
    """``quarantined``: FAILED splits (oldest first, at most 1000); ``held``: splits another
    live run holds (its lease not expired), ``held_by`` those runs, ``held_seconds`` until
    their last lease ends; ``rebuilding``: splits
    HELD while a rebuild of their day is in progress; ``retrying``: splits back in the pool
    after a failed attempt (not yet quarantined), at most 1000; ``returned``: splits a
    bounded run was assigned and gave back unread although its subtasks ended without error
    (none is expected: counted so that such a run can never look complete)."""

    quarantined: tuple[QuarantinedSplit, ...] = ()
    held: int = 0
    held_by: tuple[str, ...] = ()
    held_seconds: float = 0.0  # until the last of those leases ends (a dead holder's too)
    rebuilding: int = 0
    retrying: tuple[QuarantinedSplit, ...] = ()
    returned: int = 0

    @property
    def unread(self) -> int:
        """Splits left unread for now (exit code 4 when nothing is quarantined)."""
        return self.held + self.rebuilding + len(self.retrying) + self.returned


def input_left(
    engine: sa.Engine, source: str, run_id: str, days: Sequence[date] | None
) -> InputLeft:
    """The input of ``source`` (of partitions ``days``) that run ``run_id`` leaves unread."""
    scope = [splits.c.source == source]
    if days is not None:
        scope.append(splits.c.partition_key.in_(list(days)))
    others = sa.and_(
        *scope,
        splits.c.status.in_([SplitStatus.ASSIGNED, SplitStatus.READING]),
        splits.c.run_id.is_distinct_from(run_id),
        splits.c.lease_expires_at > sa.func.now(),
    )
    with engine.connect() as conn:
        held = conn.execute(
            sa.select(
                splits.c.run_id,
                sa.func.count(),
                sa.func.extract("epoch", sa.func.max(splits.c.lease_expires_at) - sa.func.now()),
            )
            .where(others)
            .group_by(splits.c.run_id)
            .order_by(splits.c.run_id)
        ).all()
        rebuilding = conn.execute(
            sa.select(sa.func.count()).where(*scope, splits.c.status == SplitStatus.HELD)
        ).scalar_one()
    return InputLeft(
        quarantined=tuple(quarantined(engine, source, days=days)),
        held=sum(int(n) for _, n, _ in held),
        held_by=tuple(str(run) for run, _, _ in held),
        held_seconds=max((float(left) for _, _, left in held), default=0.0),
        rebuilding=int(rebuilding),
        retrying=tuple(quarantined(engine, source, days=days, retrying=True)),
    )
