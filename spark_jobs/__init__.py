"""Sluice reading: everything that runs inside a Spark task, and the job entry points.

Sub-packages: ``runtime`` (mailbox), ``async_io`` (async wait operator and queues), ``source``
(split readers, fetcher, emitter, source reader), ``lookup`` (Postgres lookups), ``sink``
(transactional Parquet), ``jobs`` (driver and subtask entry points).
"""
