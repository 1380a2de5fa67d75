"""Alembic environment: migrations run through the Engine handed over by Sluice."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from enumerator_service._schema import SCHEMA, metadata

engine = context.config.attributes["engine"]

with engine.begin() as connection:
    # Runs (and `db upgrade`, `demo`) may start at once: one migrates, the others wait for it
    # and then find the schema at head (the lock is held until this transaction ends).
    connection.execute(text("SELECT pg_advisory_xact_lock(hashtext('sluice.migrations'))"))
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=lambda name, type_, _parent: type_ != "schema" or name == SCHEMA,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
