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
- ``cdc_remote`` (``public.cdc_remote`` on a server of its own, ``url_env``): as
  ``cdc_kills``, with the sink and Sluice's records on the platform's server.
"""

from __future__ import annotations

from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink

__all__ = [
    "KILLS_TABLE",
    "REMOTE_TABLE",
    "SNAPSHOT_TABLE",
    "cdc_kills",
    "cdc_remote",
    "cdc_snapshot",
]

KILLS_TABLE = "public.cdc_kills"
SNAPSHOT_TABLE = "public.cdc_snapshot"
REMOTE_TABLE = "public.cdc_remote"
#: The variable holding the URL of ``cdc_remote``'s source server.
REMOTE_URL_ENV = "SLUICE_FAULTS_CDC_SOURCE_URL"
_SCHEMA = {"id": "int64", "v": "string", "n": "int64"}


def _pipeline(name: str, table: str, rows_per_chunk: int, url_env: str | None = None) -> Pipeline:
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table], key="id", schema=_SCHEMA, rows_per_chunk=rows_per_chunk, url_env=url_env
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


cdc_kills = _pipeline("cdc_kills", KILLS_TABLE, 2_000)
cdc_snapshot = _pipeline("cdc_snapshot", SNAPSHOT_TABLE, 25_000)
cdc_remote = _pipeline("cdc_remote", REMOTE_TABLE, 2_000, url_env=REMOTE_URL_ENV)
