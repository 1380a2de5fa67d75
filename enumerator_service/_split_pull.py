"""The statement that hands a reader subtask its next splits (``SplitStore.pull_splits``).

It is the hottest control-path call (every reader subtask, once per request), so it is a
fixed textual statement: no Core tree is built and cache-keyed per call, and psycopg
prepares it after a few executions. Pure functions; they never block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.sql.compiler import IdentifierPreparer

from enumerator_service._schema import splits

__all__ = ["BYTE_RANGE_KINDS", "pull_parameters", "pull_statement", "waiting_statement"]

#: Split kinds whose offsets are byte positions, so ``end - start`` is the split's size.
BYTE_RANGE_KINDS = ("jsonl", "csv")


@functools.cache
def pull_statement(quote: IdentifierPreparer) -> sa.TextClause:
    """Claim a prefix of the run's next unheld ASSIGNED splits; RETURNING every column.

    The candidates (at most ``:max_splits``, in (partition_key, id) order, read off the
    ``(run_id, status, partition_key, id)`` index) are locked with SKIP LOCKED, so two
    pullers never claim the same split. A running byte sum keeps a prefix of them — the first
    always, then others while the sizes add up to ``:max_bytes`` — so the hand-out stays in
    (partition_key, id) order; a split of unknown size counts as ``:unknown_size`` (more than
    the budget). Each claimed split gets its own epoch + 1 and lease, as a single pull would.
    """
    table = quote.format_table(splits)
    q = quote.quote
    returned = ", ".join(f"{table}.{q(column.name)}" for column in splits.c)
    return sa.text(
        f"WITH candidates AS (SELECT {q('id')} AS id, {q('partition_key')} AS pk,"
        f" CASE WHEN {q('kind')} = ANY(:byte_kinds) AND {q('end_offset')} IS NOT NULL"
        f" THEN {q('end_offset')} - {q('start_offset')} ELSE :unknown_size END AS size"
        f" FROM {table} WHERE {q('run_id')} = :run_id AND {q('status')} = 'ASSIGNED'"
        f" AND (NOT {q('kind')} = ANY(:owned_kinds) OR {_owner(q)} = :subtask)"
        f" ORDER BY {q('partition_key')}, {q('id')} LIMIT :max_splits"
        " FOR UPDATE SKIP LOCKED),"
        " claimed AS (SELECT id FROM (SELECT id, row_number() OVER w AS n,"
        " sum(size) OVER w AS bytes FROM candidates WINDOW w AS (ORDER BY pk, id)) AS c"
        " WHERE n = 1 OR bytes <= :max_bytes)"
        f" UPDATE {table} SET {q('status')} = 'READING', {q('subtask')} = :subtask,"
        f" {q('epoch')} = {table}.{q('epoch')} + 1,"
        f" {q('attempts')} = {table}.{q('attempts')} + 1,"
        f" {q('lease_expires_at')} = now() + make_interval(secs => :lease_seconds)"
        f" FROM claimed WHERE {table}.{q('id')} = claimed.id"
        # Already locked, so never false: kept so the statement is safe on its own.
        f" AND {table}.{q('status')} = 'ASSIGNED'"
        f" RETURNING {returned}"
    )


@functools.cache
def waiting_statement(quote: IdentifierPreparer) -> sa.TextClause:
    """Whether the run still has ASSIGNED splits this subtask may pull — read without locks,
    so splits another transaction holds right now count (SKIP LOCKED passed over them).
    Takes the parameters of :func:`pull_statement`."""
    table = quote.format_table(splits)
    q = quote.quote
    return sa.text(
        f"SELECT EXISTS (SELECT FROM {table} WHERE {q('run_id')} = :run_id"
        f" AND {q('status')} = 'ASSIGNED'"
        f" AND (NOT {q('kind')} = ANY(:owned_kinds) OR {_owner(q)} = :subtask))"
    )


def _owner(q: Callable[[str], str]) -> str:
    """The subtask that owns a stream split ``"<topic>/<partition>"`` among ``:owners``
    (Flink's KafkaSourceEnumerator: a topic's partitions round-robin from a start index
    given by a stable hash of the topic — Postgres's ``hashtext``)."""
    uri = q("uri")
    # "<topic>/<partition>", or a day's split of it: "<topic>/<partition>@YYYY-MM-DD".
    topic = f"regexp_replace({uri}, '/[0-9]+(@[0-9-]+)?$', '')"
    partition = f"coalesce(substring({uri} from '/([0-9]+)(?:@[0-9-]+)?$'), '0')::bigint"
    owners = "greatest(:owners, 1)"
    start = f"mod((hashtext({topic})::bigint * 31) & 2147483647, {owners})"
    return f"mod({start} + {partition}, {owners})"


def pull_parameters(
    run_id: str,
    subtask: int,
    lease_seconds: float,
    *,
    max_splits: int,
    max_bytes: int,
    owned_kinds: Sequence[str] = (),
    owners: int = 1,
) -> dict[str, object]:
    """The bound parameters of :func:`pull_statement`. ``owned_kinds``: split kinds a
    subtask only pulls when it owns them (stream partitions, read all at once by their
    owner; see ``_owner``) among ``owners`` subtasks; other kinds go to whoever asks."""
    if max_splits < 1:
        raise ValueError(f"max_splits must be at least 1, not {max_splits}")
    return {
        "run_id": run_id,
        "subtask": subtask,
        "lease_seconds": float(lease_seconds),
        "max_splits": max_splits,
        "max_bytes": max(0, max_bytes),
        "unknown_size": max(0, max_bytes) + 1,  # never fits the budget: such a split goes alone
        "byte_kinds": list(BYTE_RANGE_KINDS),
        "owned_kinds": list(owned_kinds),
        "owners": max(1, owners),
    }
