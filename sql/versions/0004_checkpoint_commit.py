"""checkpoint commit: per-checkpoint sink transactions, pending inputs, ack attempts

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 10:05:00

Output now commits per checkpoint rather than per split, so ``sink_transactions`` changes
shape. Its rows are bookkeeping of staged output only: published files stay where they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "splits",
        sa.Column("pending", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        schema="sluice",
    )
    op.add_column("checkpoints", sa.Column("reason", sa.Text(), nullable=True), schema="sluice")
    op.add_column(
        "checkpoint_acks",
        sa.Column("attempt", sa.Text(), server_default="", nullable=False),
        schema="sluice",
    )
    op.alter_column("checkpoint_acks", "attempt", server_default=None, schema="sluice")
    op.add_column(
        "checkpoint_acks",
        sa.Column("final", sa.Boolean(), server_default="false", nullable=False),
        schema="sluice",
    )
    op.drop_table("sink_transactions", schema="sluice")
    op.create_table(
        "sink_transactions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("subtask", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("sink", sa.Text(), nullable=False),
        sa.Column("staged", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column("dead_letters", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sink_transactions")),
        sa.UniqueConstraint(
            "run_id",
            "subtask",
            "attempt",
            "checkpoint_id",
            name=op.f("uq_sink_transactions_run_id_subtask_attempt_checkpoint_id"),
        ),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_sink_transactions_committed_published"),
        "sink_transactions",
        ["committed", "published"],
        unique=False,
        schema="sluice",
    )


def downgrade() -> None:
    op.drop_table("sink_transactions", schema="sluice")
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
    op.drop_column("checkpoint_acks", "final", schema="sluice")
    op.drop_column("checkpoint_acks", "attempt", schema="sluice")
    op.drop_column("checkpoints", "reason", schema="sluice")
    op.drop_column("splits", "pending", schema="sluice")
