"""splits assigned_checkpoint

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 08:37:02.094919
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "splits", sa.Column("assigned_checkpoint", sa.BigInteger(), nullable=True), schema="sluice"
    )


def downgrade() -> None:
    op.drop_column("splits", "assigned_checkpoint", schema="sluice")
