"""partition rebuilds: re-materialising a processed partition replaces its output

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-21 12:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_OLD_STATUSES = "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED')"
_NEW_STATUSES = "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED', 'HELD')"


def upgrade() -> None:
    op.create_table(
        "partition_rebuilds",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("partition_key", sa.Date(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="BUILDING", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("swapped_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('BUILDING', 'SWAPPING', 'DONE', 'ABANDONED')",
            name=op.f("ck_partition_rebuilds_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_partition_rebuilds")),
        schema="sluice",
    )
    op.create_index(
        op.f("ix_partition_rebuilds_source_partition_key"),
        "partition_rebuilds",
        ["source", "partition_key"],
        unique=True,
        schema="sluice",
        postgresql_where=sa.text("status IN ('BUILDING', 'SWAPPING')"),
    )
    op.add_column("splits", sa.Column("rebuild_id", sa.BigInteger()), schema="sluice")
    op.add_column("dead_letters", sa.Column("rebuild_id", sa.BigInteger()), schema="sluice")
    op.drop_constraint(op.f("ck_splits_status"), "splits", schema="sluice", type_="check")
    op.create_check_constraint(op.f("ck_splits_status"), "splits", _NEW_STATUSES, schema="sluice")


def downgrade() -> None:
    op.execute("UPDATE sluice.splits SET status = 'UNASSIGNED' WHERE status = 'HELD'")
    op.drop_constraint(op.f("ck_splits_status"), "splits", schema="sluice", type_="check")
    op.create_check_constraint(op.f("ck_splits_status"), "splits", _OLD_STATUSES, schema="sluice")
    op.drop_column("dead_letters", "rebuild_id", schema="sluice")
    op.drop_column("splits", "rebuild_id", schema="sluice")
    op.drop_index(
        op.f("ix_partition_rebuilds_source_partition_key"),
        table_name="partition_rebuilds",
        schema="sluice",
    )
    op.drop_table("partition_rebuilds", schema="sluice")
