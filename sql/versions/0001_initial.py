"""initial platform schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-21 07:30:04.249757
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), server_default="PENDING", nullable=False),
        sa.Column(
            "triggered_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('PENDING', 'COMPLETED', 'ABORTED')", name=op.f("ck_checkpoints_status")
        ),
        sa.PrimaryKeyConstraint("run_id", "checkpoint_id", name=op.f("pk_checkpoints")),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_checkpoints_status_completed_at"),
        "checkpoints",
        ["status", "completed_at"],
        unique=False,
        schema="sluice",
    )
    op.create_table(
        "enumerator_state",
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("cursor", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("source", name=op.f("pk_enumerator_state")),
        schema="sluice",
    )
    op.create_table(
        "splits",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=True),
        sa.Column("partition_key", sa.Date(), nullable=True),
        sa.Column("status", sa.Text(), server_default="UNASSIGNED", nullable=False),
        sa.Column("committed_offset", sa.BigInteger(), nullable=True),
        sa.Column("committed_watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("subtask", sa.Integer(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("assigned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED')",
            name=op.f("ck_splits_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_splits")),
        sa.UniqueConstraint(
            "source", "uri", "start_offset", name=op.f("uq_splits_source_uri_start_offset")
        ),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_splits_run_id_status"),
        "splits",
        ["run_id", "status"],
        unique=False,
        schema="sluice",
    )
    op.create_index(
        op.f("ix_splits_source_status_partition_key"),
        "splits",
        ["source", "status", "partition_key"],
        unique=False,
        schema="sluice",
    )
    op.create_table(
        "checkpoint_acks",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("subtask", sa.Integer(), nullable=False),
        sa.Column("snapshot", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "acked_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["run_id", "checkpoint_id"],
            ["sluice.checkpoints.run_id", "sluice.checkpoints.checkpoint_id"],
            name=op.f("fk_checkpoint_acks_run_id_checkpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "checkpoint_id", "subtask", name=op.f("pk_checkpoint_acks")
        ),
        schema="sluice",
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("split_id", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["split_id"],
            ["sluice.splits.id"],
            name=op.f("fk_dead_letters_split_id_splits"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
        sa.UniqueConstraint("split_id", "offset", name=op.f("uq_dead_letters_split_id_offset")),
        schema="sluice",
    )
    op.create_table(
        "sink_transactions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("subtask", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column("split_id", sa.BigInteger(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("staged_path", sa.Text(), nullable=False),
        sa.Column("final_path", sa.Text(), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column("committed", sa.Boolean(), server_default="false", nullable=False),
        sa.Column("published", sa.Boolean(), server_default="false", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["split_id"],
            ["sluice.splits.id"],
            name=op.f("fk_sink_transactions_split_id_splits"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sink_transactions")),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_sink_transactions_committed_published"),
        "sink_transactions",
        ["committed", "published"],
        unique=False,
        schema="sluice",
    )
    op.create_index(
        op.f("ix_sink_transactions_split_id"),
        "sink_transactions",
        ["split_id"],
        unique=False,
        schema="sluice",
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_sink_transactions_split_id"), table_name="sink_transactions", schema="sluice"
    )
    op.drop_index(
        op.f("ix_sink_transactions_committed_published"),
        table_name="sink_transactions",
        schema="sluice",
    )
    op.drop_table("sink_transactions", schema="sluice")
    op.drop_table("dead_letters", schema="sluice")
    op.drop_table("checkpoint_acks", schema="sluice")
    op.drop_index(
        op.f("ix_splits_source_status_partition_key"), table_name="splits", schema="sluice"
    )
    op.drop_index(op.f("ix_splits_run_id_status"), table_name="splits", schema="sluice")
    op.drop_table("splits", schema="sluice")
    op.drop_table("enumerator_state", schema="sluice")
    op.drop_index(
        op.f("ix_checkpoints_status_completed_at"), table_name="checkpoints", schema="sluice"
    )
    op.drop_table("checkpoints", schema="sluice")
