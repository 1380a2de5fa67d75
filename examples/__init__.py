"""Reference pipelines, written the way a user writes them (the platform knows no schema).

- ``examples.clickstream``: events enriched with a users table, Parquet by day (the demo);
- ``examples.clickstream_iceberg``: the same pipeline writing the Iceberg table
  ``analytics.clickstream_events``, and downstream of it the ``daily_revenue_by_country``
  asset (``examples.clickstream_revenue``: reads a day by snapshot, refreshed by Dagster's
  declarative automation when the day completes);
- ``examples.orders``: CSV orders, two lookups (a composite key; a fully cached rate table),
  a Map and a Filter, upserted into Postgres;
- ``examples.scoring``: events scored by an HTTP service through an AsyncMap.

Register them with
``SLUICE_PIPELINES=examples.clickstream,examples.clickstream_iceberg,examples.orders`` (the
default of ``make`` and of the Docker deployment).
"""
