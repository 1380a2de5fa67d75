"""files are immutable or detected: a file's identity (size, mtime, inode) recorded with its
splits, versions of a changed file, and the SUPERSEDED status of an older version's splits

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 12:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_OLD_STATUSES = "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED', 'HELD', 'FAILED')"
_NEW_STATUSES = (
    "status IN ('UNASSIGNED', 'ASSIGNED', 'READING', 'COMPLETED', 'HELD', 'FAILED', 'SUPERSEDED')"
)


def upgrade() -> None:
    for name in ("file_size", "file_mtime_ns", "file_inode"):
        op.add_column("splits", sa.Column(name, sa.BigInteger()), schema="sluice")
    op.add_column(
        "splits",
        sa.Column("file_version", sa.Integer(), server_default="0", nullable=False),
        schema="sluice",
    )
    op.drop_constraint(
        op.f("uq_splits_source_uri_start_offset"), "splits", schema="sluice", type_="unique"
    )
    op.create_unique_constraint(
        op.f("uq_splits_source_uri_start_offset_file_version"),
        "splits",
        ["source", "uri", "start_offset", "file_version"],
        schema="sluice",
    )
    op.drop_constraint(op.f("ck_splits_status"), "splits", schema="sluice", type_="check")
    op.create_check_constraint(op.f("ck_splits_status"), "splits", _NEW_STATUSES, schema="sluice")


def downgrade() -> None:
    # Only the latest version of each file can stay under the old unique key.
    op.execute("DELETE FROM sluice.splits WHERE status = 'SUPERSEDED'")
    op.execute(
        "DELETE FROM sluice.splits s USING sluice.splits n WHERE n.source = s.source"
        " AND n.uri = s.uri AND n.start_offset = s.start_offset"
        " AND n.file_version > s.file_version"
    )
    op.drop_constraint(op.f("ck_splits_status"), "splits", schema="sluice", type_="check")
    op.create_check_constraint(op.f("ck_splits_status"), "splits", _OLD_STATUSES, schema="sluice")
    op.drop_constraint(
        op.f("uq_splits_source_uri_start_offset_file_version"),
        "splits",
        schema="sluice",
        type_="unique",
    )
    op.create_unique_constraint(
        op.f("uq_splits_source_uri_start_offset"),
        "splits",
        ["source", "uri", "start_offset"],
        schema="sluice",
    )
    for name in ("file_version", "file_inode", "file_mtime_ns", "file_size"):
        op.drop_column("splits", name, schema="sluice")
