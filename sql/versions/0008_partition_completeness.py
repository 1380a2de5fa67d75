"""event time: run watermarks, committed counts per output partition, partition completions,
rebuilds by event day (which partitions each split fed, the rebuild's counts)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 00:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _now() -> sa.TextClause:
    return sa.text("now()")


def _big(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), server_default="0", nullable=False)


def upgrade() -> None:
    op.add_column("splits", sa.Column("rebuild_day", sa.Date()), schema="sluice")
    op.add_column(
        "splits",
        sa.Column("rebuild_fresh", sa.Boolean(), server_default="false", nullable=False),
        schema="sluice",
    )
    op.add_column("dead_letters", sa.Column("partition_key", sa.Date()), schema="sluice")
    op.add_column(
        "partition_rebuilds",
        sa.Column("event_days", sa.Boolean(), server_default="false", nullable=False),
        schema="sluice",
    )
    for name in ("rows", "dead_letters", "foreign_rows"):
        op.add_column("partition_rebuilds", _big(name), schema="sluice")
    op.create_table(
        "split_partitions",
        sa.Column("split_id", sa.BigInteger(), nullable=False),
        sa.Column("partition_key", sa.Date(), nullable=False),
        sa.ForeignKeyConstraint(
            ["split_id"],
            ["sluice.splits.id"],
            name=op.f("fk_split_partitions_split_id_splits"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("split_id", "partition_key", name=op.f("pk_split_partitions")),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_split_partitions_partition_key"),
        "split_partitions",
        ["partition_key"],
        schema="sluice",
    )
    op.add_column(
        "sink_transactions",
        sa.Column("partition_counts", postgresql.JSONB(astext_type=sa.Text())),
        schema="sluice",
    )
    op.create_table(
        "partition_stats",
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("partition_key", sa.Date(), nullable=False),
        sa.Column("rows", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("dead_letters", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("late_records", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("foreign_rows", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("generation", sa.Integer(), server_default="0", nullable=False),
        sa.Column("open", sa.Boolean(), server_default="true", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("source", "partition_key", name=op.f("pk_partition_stats")),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_partition_stats_source_open_partition_key"),
        "partition_stats",
        ["source", "open", "partition_key"],
        schema="sluice",
    )
    op.create_table(
        "partition_completions",
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("partition_key", sa.Date(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column(
            "completed_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False
        ),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("watermark", sa.DateTime(timezone=True)),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("dead_letters", sa.BigInteger(), nullable=False),
        sa.Column("late_records", sa.BigInteger(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint(
            "source", "partition_key", "generation", name=op.f("pk_partition_completions")
        ),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_partition_completions_reported_at_completed_at"),
        "partition_completions",
        ["reported_at", "completed_at"],
        schema="sluice",
    )
    op.create_table(
        "run_watermarks",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text()),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("watermark", sa.DateTime(timezone=True)),
        sa.Column("finished", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_now(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_watermarks")),
        schema="sluice",
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_split_partitions_partition_key"), table_name="split_partitions", schema="sluice"
    )
    op.drop_table("split_partitions", schema="sluice")
    for name in ("foreign_rows", "dead_letters", "rows", "event_days"):
        op.drop_column("partition_rebuilds", name, schema="sluice")
    op.drop_column("dead_letters", "partition_key", schema="sluice")
    op.drop_column("splits", "rebuild_fresh", schema="sluice")
    op.drop_column("splits", "rebuild_day", schema="sluice")
    op.drop_table("run_watermarks", schema="sluice")
    op.drop_index(
        op.f("ix_partition_completions_reported_at_completed_at"),
        table_name="partition_completions",
        schema="sluice",
    )
    op.drop_table("partition_completions", schema="sluice")
    op.drop_index(
        op.f("ix_partition_stats_source_open_partition_key"),
        table_name="partition_stats",
        schema="sluice",
    )
    op.drop_table("partition_stats", schema="sluice")
    op.drop_column("sink_transactions", "partition_counts", schema="sluice")
