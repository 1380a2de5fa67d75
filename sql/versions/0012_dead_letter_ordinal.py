"""a dead letter's ordinal among those of its split and offset: a change stream's changes of
one transaction share their commit LSN as the offset, and every bad one is kept (the unique
key was the split and offset alone, so all but one of them were dropped)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dead_letters",
        sa.Column("ordinal", sa.Integer(), server_default="0", nullable=False),
        schema="sluice",
    )
    op.drop_constraint("uq_dead_letters_split_id_offset", "dead_letters", schema="sluice")
    op.create_unique_constraint(
        op.f("uq_dead_letters_split_id_offset_ordinal"),
        "dead_letters",
        ["split_id", "offset", "ordinal"],
        schema="sluice",
    )


def downgrade() -> None:
    op.execute('DELETE FROM sluice.dead_letters WHERE "ordinal" > 0')
    op.drop_constraint("uq_dead_letters_split_id_offset_ordinal", "dead_letters", schema="sluice")
    op.create_unique_constraint(
        op.f("uq_dead_letters_split_id_offset"),
        "dead_letters",
        ["split_id", "offset"],
        schema="sluice",
    )
    op.drop_column("dead_letters", "ordinal", schema="sluice")
