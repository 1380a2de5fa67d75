"""poison splits: a split whose content keeps failing is quarantined (FAILED)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 23:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_OLD_STATUSES = "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED', 'HELD')"
_NEW_STATUSES = "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED', 'HELD', 'FAILED')"


def upgrade() -> None:
    op.add_column(
        "splits",
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        schema="sluice",
    )
    op.add_column("splits", sa.Column("failure_reason", sa.Text()), schema="sluice")
    op.add_column("splits", sa.Column("last_error", sa.Text()), schema="sluice")
    op.add_column("splits", sa.Column("failed_epoch", sa.BigInteger()), schema="sluice")
    op.add_column("splits", sa.Column("failed_at", sa.DateTime(timezone=True)), schema="sluice")
    op.drop_constraint(op.f("ck_splits_status"), "splits", schema="sluice", type_="check")
    op.create_check_constraint(op.f("ck_splits_status"), "splits", _NEW_STATUSES, schema="sluice")


def downgrade() -> None:
    op.execute("UPDATE sluice.splits SET status = 'UNASSIGNED' WHERE status = 'FAILED'")
    op.drop_constraint(op.f("ck_splits_status"), "splits", schema="sluice", type_="check")
    op.create_check_constraint(op.f("ck_splits_status"), "splits", _OLD_STATUSES, schema="sluice")
    for column in ("failed_at", "failed_epoch", "last_error", "failure_reason", "failures"):
        op.drop_column("splits", column, schema="sluice")
