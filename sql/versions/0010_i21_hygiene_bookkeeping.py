"""checkpoint bookkeeping pruning: an index of each subtask's acknowledgements in order

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        op.f("ix_checkpoint_acks_run_id_subtask_checkpoint_id"),
        "checkpoint_acks",
        ["run_id", "subtask", "checkpoint_id"],
        schema="sluice",
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_checkpoint_acks_run_id_subtask_checkpoint_id"),
        table_name="checkpoint_acks",
        schema="sluice",
    )
