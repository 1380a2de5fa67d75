"""What Dagster shows about an Iceberg table the sink writes: its name and URI (Dagster's
``dagster/table_name`` and ``dagster/uri`` keys: the asset's table in the catalog view), the
current snapshot, and what one run added (from the snapshots its checkpoints committed, found
by the ``sluice.run-id`` of their summaries).

Threading: reads table metadata (the catalog, the metadata files); call from a Dagster step or
sensor tick.
"""

from __future__ import annotations

from pyiceberg.table import Table

from spark_jobs.connectors.iceberg._catalog import DEFAULT_CATALOG
from spark_jobs.connectors.iceberg._commit import RUN_ID
from spark_jobs.connectors.iceberg._upsert import ROWS_WRITTEN

__all__ = ["table_metadata"]


def table_metadata(
    table: Table | None, catalog: str | None, name: str, run_id: str | None
) -> dict[str, str | int]:
    """Plain values (never a secret): the table's catalog name and URI, ``snapshot_id``, and
    for ``run_id`` the ``rows_added``, ``files_added`` and ``snapshots_added`` of its
    checkpoints. ``table`` None: not created yet (the name only)."""
    found: dict[str, str | int] = {"dagster/table_name": f"{catalog or DEFAULT_CATALOG}.{name}"}
    if table is None:
        return found
    found["dagster/uri"] = table.location()
    current = table.current_snapshot()
    if current is not None:
        found["snapshot_id"] = current.snapshot_id
    if run_id is not None:
        mine = [
            s.summary
            for s in table.snapshots()
            if s.summary is not None and s.summary.get(RUN_ID) == run_id
        ]
        # (an upsert's snapshot: the rows it wrote, not the ones copy-on-write carried over)
        found["rows_added"] = sum(
            int(s.get(ROWS_WRITTEN) or s.get("added-records") or 0) for s in mine
        )
        found["files_added"] = sum(int(s.get("added-data-files", 0)) for s in mine)
        found["snapshots_added"] = len(mine)
    return found
