"""pipelines: records dropped by steps, and the source of checkpoints and sink output

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("source", sa.Text()), schema="sluice")
    op.add_column("sink_transactions", sa.Column("source", sa.Text()), schema="sluice")
    op.add_column(
        "sink_transactions",
        sa.Column("dropped_count", sa.BigInteger(), server_default="0", nullable=False),
        schema="sluice",
    )


def downgrade() -> None:
    op.drop_column("sink_transactions", "dropped_count", schema="sluice")
    op.drop_column("sink_transactions", "source", schema="sluice")
    op.drop_column("checkpoints", "source", schema="sluice")
