"""a split's release time: a stream split given back by a run waits from then, not from its
registration (``sluice status``'s oldest waiting split)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 13:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("splits", sa.Column("released_at", sa.DateTime(timezone=True)), schema="sluice")


def downgrade() -> None:
    op.drop_column("splits", "released_at", schema="sluice")
