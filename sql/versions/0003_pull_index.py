"""pull index

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 08:56:37.193705
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(op.f("ix_splits_run_id_status"), table_name="splits", schema="sluice")
    op.create_index(
        op.f("ix_splits_run_id_status_partition_key_id"),
        "splits",
        ["run_id", "status", "partition_key", "id"],
        unique=False,
        schema="sluice",
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_splits_run_id_status_partition_key_id"), table_name="splits", schema="sluice"
    )
    op.create_index(
        op.f("ix_splits_run_id_status"),
        "splits",
        ["run_id", "status"],
        unique=False,
        schema="sluice",
    )
