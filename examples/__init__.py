"""Reference pipelines, written the way a user writes them (the platform knows no schema).

- ``examples.clickstream``: events enriched with a users table, Parquet by day (the demo);
- ``examples.orders``: CSV orders, two lookups (a composite key; a fully cached rate table),
  a Map and a Filter, upserted into Postgres;
- ``examples.scoring``: events scored by an HTTP service through an AsyncMap.

Register them with ``SLUICE_PIPELINES=examples.clickstream,examples.orders``.
"""
