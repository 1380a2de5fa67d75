"""The platform's Postgres schema (``sluice``) as SQLAlchemy Core metadata.

This metadata is the single source of truth; ``sql/versions`` holds the Alembic migrations that
produce it, and ``tests/integration/test_migrations.py`` proves the two agree.
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy import text as sa_text
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "ACTIVE_SPLIT",
    "CHECKPOINT_STATUSES",
    "SCHEMA",
    "SPLIT_STATUSES",
    "CheckpointStatus",
    "RebuildStatus",
    "SplitStatus",
    "checkpoint_acks",
    "checkpoints",
    "dead_letters",
    "enumerator_state",
    "metadata",
    "partition_completions",
    "partition_rebuilds",
    "partition_stats",
    "run_watermarks",
    "sink_transactions",
    "split_partitions",
    "splits",
]

SCHEMA = "sluice"


class SplitStatus(StrEnum):
    """Where a split is in its life (``splits.status``)."""

    #: In the pool.
    UNASSIGNED = "UNASSIGNED"
    #: Given to a run, not yet pulled by a subtask.
    ASSIGNED = "ASSIGNED"
    #: Pulled by a subtask under a lease.
    READING = "READING"
    #: Output committed up to its end.
    COMPLETED = "COMPLETED"
    #: Registered while its partition is rebuilt; released to the pool by the rebuild's swap.
    HELD = "HELD"
    #: Quarantined: its content failed ``SLUICE_SPLIT_MAX_ATTEMPTS`` attempts (a poison file);
    #: kept out of every run until ``sluice retry`` puts it back.
    FAILED = "FAILED"
    #: An older version's split of a file that changed and was registered again (see
    #: ``enumerator_service._file_versions``): never read; kept for its history.
    SUPERSEDED = "SUPERSEDED"


class CheckpointStatus(StrEnum):
    """``checkpoints.status``."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"


class RebuildStatus(StrEnum):
    """``partition_rebuilds.status``: BUILDING → SWAPPING → DONE, or BUILDING → ABANDONED."""

    BUILDING = "BUILDING"
    SWAPPING = "SWAPPING"
    DONE = "DONE"
    ABANDONED = "ABANDONED"


#: A split in a run's hands (its lease is renewed, it may be pulled or is being read).
ACTIVE_SPLIT = (SplitStatus.ASSIGNED, SplitStatus.READING)
#: Splits not read to the end and committed yet: they may still produce records (of any day).
UNREAD_SPLIT = (
    SplitStatus.UNASSIGNED,
    SplitStatus.ASSIGNED,
    SplitStatus.READING,
    SplitStatus.HELD,
)
SPLIT_STATUSES = tuple(status.value for status in SplitStatus)
CHECKPOINT_STATUSES = tuple(status.value for status in CheckpointStatus)

metadata = MetaData(
    schema=SCHEMA,
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    },
)

_now = func.now()

splits = Table(
    "splits",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("source", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("uri", Text, nullable=False),
    Column("start_offset", BigInteger, nullable=False, server_default="0"),
    # NULL end offset: unbounded split (read until the source says there is no more).
    Column("end_offset", BigInteger),
    Column("partition_key", Date),
    Column("status", Text, nullable=False, server_default="UNASSIGNED"),
    # Resume rule: committed_offset is the first byte *not yet* covered by committed output;
    # a restored reader starts exactly there. NULL means "from start_offset".
    Column("committed_offset", BigInteger),
    Column("committed_watermark", DateTime(timezone=True)),
    # The async operator's inputs from this split that were in flight at the committed
    # checkpoint (JSON-encoded records, in input order): re-invoked before reading on.
    Column("pending", JSONB),
    Column("run_id", Text),
    Column("subtask", Integer),
    Column("lease_expires_at", DateTime(timezone=True)),
    # The checkpoint whose snapshot first captured the current hand-out to a subtask; NULL
    # while no snapshot has. Restoring checkpoint k returns the splits handed out after k.
    Column("assigned_checkpoint", BigInteger),
    # Fencing epoch: bumped on every hand-out; a commit must present the current epoch.
    Column("epoch", BigInteger, nullable=False, server_default="0"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("registered_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("assigned_at", DateTime(timezone=True)),
    # When a run last gave the split back (its lease expired or the run ended): a stream
    # split, read up to then, waits from here, not from its registration.
    Column("released_at", DateTime(timezone=True)),
    Column("completed_at", DateTime(timezone=True)),
    # The partition rebuild this split is being re-read for (NULL: none). Its output goes to
    # the rebuild's folder, which replaces the partition's folder once every member completed.
    Column("rebuild_id", BigInteger),
    # The partition (event day) that rebuild replaces: a member writes only that day's rows
    # (a landing file may feed several days). NULL exactly when rebuild_id is.
    Column("rebuild_day", Date),
    # A member no run had read before the rebuild (a new file of the day): its records of
    # other days are written as a first reading's, not dropped.
    Column("rebuild_fresh", Boolean, nullable=False, server_default="false"),
    # Poison splits (quarantine): attempts that failed on the split's own content (counted
    # when the checkpoint carrying the failure commits), what went wrong the last time, and
    # the fencing epoch of the attempt last counted (a repeated commit of it counts once).
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("failure_reason", Text),
    Column("last_error", Text),
    Column("failed_epoch", BigInteger),
    Column("failed_at", DateTime(timezone=True)),
    # The identity of the file version the split was cut from, taken at discovery (NULL: not
    # recorded, table splits and splits of older versions): a reader refuses the split when
    # the file under ``uri`` differs (see ``enumerator_service._file_identity``).
    Column("file_size", BigInteger),
    Column("file_mtime_ns", BigInteger),
    Column("file_inode", BigInteger),
    # 0 for a file's first registration, +1 for each new version of a changed file.
    Column("file_version", Integer, nullable=False, server_default="0"),
    UniqueConstraint("source", "uri", "start_offset", "file_version"),
    # HELD: registered while its partition is being rebuilt (an event-day source: while any
    # of its days is, or not read yet when the rebuild started); released by the swap.
    CheckConstraint(f"status IN {SPLIT_STATUSES!r}", name="status"),
    Index(None, "source", "status", "partition_key"),
    # Serves pull_next: the run's next ASSIGNED split in (partition_key, id) order, read off
    # the index instead of sorting the run's splits on every pull.
    Index(None, "run_id", "status", "partition_key", "id"),
)

enumerator_state = Table(
    "enumerator_state",
    metadata,
    Column("source", Text, primary_key=True),
    # Bounded discovery cursor, e.g. {"mtime_watermark": ..., "recent_paths": [...]}.
    Column("cursor", JSONB, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("checkpoint_id", BigInteger, primary_key=True),
    # The split source (pipeline) the run reads; NULL for checkpoints of older versions.
    Column("source", Text),
    Column("status", Text, nullable=False, server_default="PENDING"),
    Column("triggered_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("completed_at", DateTime(timezone=True)),
    # Why an ABORTED checkpoint was given up (timeout, fenced subtask, dead run, …).
    Column("reason", Text),
    CheckConstraint("status IN ('PENDING', 'COMPLETED', 'ABORTED')", name="status"),
    Index(None, "status", "completed_at"),
)

checkpoint_acks = Table(
    "checkpoint_acks",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("checkpoint_id", BigInteger, primary_key=True),
    Column("subtask", Integer, primary_key=True),
    # The task attempt that took the snapshot (a retried subtask acks under a new attempt).
    Column("attempt", Text, nullable=False),
    # The subtask's input had ended and everything was emitted: its last checkpoint.
    Column("final", Boolean, nullable=False, server_default="false"),
    # Per-subtask snapshot: split states and in-flight async inputs (staged output is in
    # sink_transactions under the same run, subtask, attempt and checkpoint).
    Column("snapshot", JSONB, nullable=False),
    Column("acked_at", DateTime(timezone=True), nullable=False, server_default=_now),
    ForeignKeyConstraint(
        ["run_id", "checkpoint_id"],
        ["checkpoints.run_id", "checkpoints.checkpoint_id"],
        ondelete="CASCADE",
    ),
    # A subtask's acknowledgements in order: its committed state (committed_acks) and what
    # the pruning of old checkpoints keeps (_bookkeeping).
    Index(None, "run_id", "subtask", "checkpoint_id"),
)

sink_transactions = Table(
    "sink_transactions",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", Text, nullable=False),
    # The split source (pipeline) of the output; NULL for transactions of older versions.
    Column("source", Text),
    Column("subtask", Integer, nullable=False),
    Column("attempt", Text, nullable=False),
    # The checkpoint whose pre-commit staged this output. It commits with the first completed
    # checkpoint >= this one acknowledged by the same attempt (an aborted checkpoint's output
    # rolls into the next), or is aborted when another attempt supersedes it.
    Column("checkpoint_id", BigInteger, nullable=False),
    Column("sink", Text, nullable=False),
    # Sink-specific description of the staged output, e.g. [{"staged", "final", "rows"}, …].
    Column("staged", JSONB, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    # Records of the same interval that the pipeline's steps removed (Filter, dropped
    # lookup misses, an AsyncMap returning nothing): rows in = rows + dropped + dead letters.
    Column("dropped_count", BigInteger, nullable=False, server_default="0"),
    # Rejected input of the same interval: [[split_id, offset, raw (base64), reason], …].
    Column("dead_letters", JSONB, nullable=False),
    # The same interval per output partition: {"YYYY-MM-DD": {"rows", "dead_letters",
    # "late_records"}, …} (NULL: none reported). Added to partition_stats when it commits.
    Column("partition_counts", JSONB),
    Column("committed", Boolean, nullable=False, server_default="false"),
    Column("published", Boolean, nullable=False, server_default="false"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("committed_at", DateTime(timezone=True)),
    Column("published_at", DateTime(timezone=True)),
    UniqueConstraint("run_id", "subtask", "attempt", "checkpoint_id"),
    Index(None, "committed", "published"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("split_id", BigInteger, ForeignKey("splits.id", ondelete="CASCADE")),
    Column("source", Text, nullable=False),
    Column("uri", Text, nullable=False),
    Column("offset", BigInteger, nullable=False),
    # At most the first 4 KiB of the rejected input.
    Column("raw", LargeBinary, nullable=False),
    Column("reason", Text, nullable=False),
    Column("run_id", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    # The rebuild that (re-)rejected the line (NULL: incremental processing). A rebuild's swap
    # deletes the partition's dead letters of earlier generations.
    Column("rebuild_id", BigInteger),
    # The output partition the dead letter counts on (a step's: the record's event day; a
    # reader's: the split's landing day): a rebuild of that day replaces it.
    Column("partition_key", Date),
    # Its place among the dead letters of its split and offset (0, 1, …; in the order its
    # block rejected them): a change stream's changes of one transaction share the commit
    # LSN as their offset.
    Column("ordinal", Integer, nullable=False, server_default="0"),
    # A split re-read after a crash re-rejects the same lines; this keeps them once.
    UniqueConstraint("split_id", "offset", "ordinal"),
)

partition_rebuilds = Table(
    "partition_rebuilds",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("source", Text, nullable=False),
    Column("partition_key", Date, nullable=False),
    # The run that started it (a later run may finish it).
    Column("run_id", Text, nullable=False),
    # BUILDING → SWAPPING → DONE, or BUILDING → ABANDONED (superseded by a newer rebuild).
    Column("status", Text, nullable=False, server_default="BUILDING"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("swapped_at", DateTime(timezone=True)),
    # Partitions by event day: any file of the source may feed the day, so files registered
    # while it rebuilds are HELD whatever their landing day (not only the day's own).
    Column("event_days", Boolean, nullable=False, server_default="false"),
    # The members' committed counts for the day (their rows of other days are not written):
    # the partition's ``partition_stats`` once the rebuild swaps.
    Column("rows", BigInteger, nullable=False, server_default="0"),
    Column("dead_letters", BigInteger, nullable=False, server_default="0"),
    Column("foreign_rows", BigInteger, nullable=False, server_default="0"),
    CheckConstraint("status IN ('BUILDING', 'SWAPPING', 'DONE', 'ABANDONED')", name="status"),
    # At most one rebuild in progress per partition.
    Index(
        None,
        "source",
        "partition_key",
        unique=True,
        postgresql_where=sa_text("status IN ('BUILDING', 'SWAPPING')"),
    ),
)

partition_stats = Table(
    "partition_stats",
    metadata,
    # Committed counts of one output partition (an event day) of a source, summed over every
    # committed sink transaction: what a partial day shows, what a completion records.
    Column("source", Text, primary_key=True),
    Column("partition_key", Date, primary_key=True),
    Column("rows", BigInteger, nullable=False, server_default="0"),
    Column("dead_letters", BigInteger, nullable=False, server_default="0"),
    Column("late_records", BigInteger, nullable=False, server_default="0"),
    # Rows written from files of another landing day (event-day partitions).
    Column("foreign_rows", BigInteger, nullable=False, server_default="0"),
    # The generation of its latest completion (0: never completed).
    Column("generation", Integer, nullable=False, server_default="0"),
    # Committed output not covered by a completion yet: a candidate for the next completion
    # (a completed partition reopens when rows are written to it again).
    Column("open", Boolean, nullable=False, server_default="true"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Index(None, "source", "open", "partition_key"),
)

partition_completions = Table(
    "partition_completions",
    metadata,
    # One row each time an output partition becomes complete, written in the transaction of
    # the checkpoint that made it so (read and marked reported by the Dagster reporter).
    Column("source", Text, primary_key=True),
    Column("partition_key", Date, primary_key=True),
    # 1 for the first completion, +1 each time a reopened partition completes again.
    Column("generation", Integer, primary_key=True),
    Column("completed_at", DateTime(timezone=True), nullable=False, server_default=_now),
    Column("run_id", Text, nullable=False),
    Column("checkpoint_id", BigInteger, nullable=False),
    # The run watermark that completed it; NULL: the run's input ended (+infinity).
    Column("watermark", DateTime(timezone=True)),
    # The partition's committed counts at completion (cumulative over generations).
    Column("rows", BigInteger, nullable=False),
    Column("dead_letters", BigInteger, nullable=False),
    Column("late_records", BigInteger, nullable=False),
    # Set by the reporter once Dagster has recorded the materialisation.
    Column("reported_at", DateTime(timezone=True)),
    Index(None, "reported_at", "completed_at"),
)

split_partitions = Table(
    "split_partitions",
    metadata,
    # Which output partitions each split fed (rows or dead letters), recorded with the
    # checkpoint that committed them: a rebuild of a day re-reads exactly these splits (plus
    # the day's own files), since a landing file may feed several event days.
    Column("split_id", BigInteger, ForeignKey("splits.id", ondelete="CASCADE"), primary_key=True),
    Column("partition_key", Date, primary_key=True),
    Index(None, "partition_key"),
)

run_watermarks = Table(
    "run_watermarks",
    metadata,
    # Live event-time state of a run, updated by each completed checkpoint: the run watermark
    # (the minimum over its subtasks, never moving backwards).
    Column("run_id", Text, primary_key=True),
    Column("source", Text),
    Column("checkpoint_id", BigInteger, nullable=False),
    # The greatest finite run watermark so far; NULL: none yet (some subtask has none).
    Column("watermark", DateTime(timezone=True)),
    # Every subtask's input ended: the run watermark is +infinity (``watermark`` keeps the
    # last finite one).
    Column("finished", Boolean, nullable=False, server_default="false"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=_now),
)
