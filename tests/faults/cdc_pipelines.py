"""The CDC fault cases' pipelines (the module named in ``SLUICE_PIPELINES`` by
``test_cdc_faults.py``; importable as ``tests.faults.cdc_pipelines`` with the repository on
``PYTHONPATH``).

Each reads one table ``(id bigint primary key, v text, n bigint)`` — the shape
``tests/cdc_oracle.py``'s ``ChangeGenerator`` writes to — with the real
``PostgresCdcSource`` into the real upsert ``PostgresSink`` ``<table>_out`` keyed on ``id``
(it keeps the greatest ``_lsn`` per key and applies deletes). No product code knows.

- ``cdc_kills`` (``public.cdc_kills``): small snapshot chunks (many splits, several in flight
  at each kill), then the stream under a concurrent writer.
- ``cdc_snapshot`` (``public.cdc_snapshot``): chunks of 25k rows, so that reading a 200k-row
  snapshot takes several seconds — long enough to crash Postgres in the middle of it.
"""

from __future__ import annotations

from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink

__all__ = ["KILLS_TABLE", "SNAPSHOT_TABLE", "cdc_kills", "cdc_snapshot"]

KILLS_TABLE = "public.cdc_kills"
SNAPSHOT_TABLE = "public.cdc_snapshot"
_SCHEMA = {"id": "int64", "v": "string", "n": "int64"}


def _pipeline(name: str, table: str, rows_per_chunk: int) -> Pipeline:
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table], key="id", schema=_SCHEMA, rows_per_chunk=rows_per_chunk
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


cdc_kills = _pipeline("cdc_kills", KILLS_TABLE, 2_000)
cdc_snapshot = _pipeline("cdc_snapshot", SNAPSHOT_TABLE, 25_000)
