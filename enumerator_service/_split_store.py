"""The Postgres-backed split store: registration, two-level assignment, leases, fencing.

Level 1 (enumerator side): splits are registered idempotently and assigned to a *run*.
Level 2 (reader side): subtasks of that run *pull* their next split lazily with
``SELECT … FOR UPDATE SKIP LOCKED``; every hand-out bumps the split's fencing epoch, and every
commit must present that epoch, so a zombie attempt can never commit.

``SplitStore`` is one object over one Engine; its methods are grouped by role in modules of
their own: registration (``_split_registration``), assignment to runs and their leases
(``_split_leases``), hand-out to subtasks (``_split_handout``), and completion and the
checkpointed hand-outs (``_split_completion``).

Threading: every method blocks on the database; call them from a fetcher or committer thread,
never from a mailbox thread.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._schema import splits
from enumerator_service._split_completion import FencedError, SplitCompletion
from enumerator_service._split_handout import SubtaskHandout
from enumerator_service._split_leases import RunAssignment
from enumerator_service._split_registration import SplitRegistration

__all__ = ["FencedError", "SplitStore"]


class SplitStore(SplitRegistration, RunAssignment, SubtaskHandout, SplitCompletion):
    """Split registration and assignment over one SQLAlchemy Engine (thread-safe)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- inspection ----------------------------------------------------------------------

    def counts(self, source: str | None = None) -> dict[str, int]:
        """Number of splits per status."""
        stmt = sa.select(splits.c.status, sa.func.count()).group_by(splits.c.status)
        if source is not None:
            stmt = stmt.where(splits.c.source == source)
        with self._engine.connect() as conn:
            return {str(status): int(n) for status, n in conn.execute(stmt).all()}
