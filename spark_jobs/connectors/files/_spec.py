"""The spec of the files source: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from os import PathLike
from typing import Literal

from spark_jobs.pipeline._sources import LatePolicy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["FileSource"]


@dataclass(frozen=True)
class FileSource:
    """Files landing in a folder; the format of each comes from its name.

    - ``schema``: field name → type (``"string"``, ``"int64"``, ``"decimal(12,2)"``,
      ``"timestamp"``, …). Only these fields are read; other fields of a record are ignored.
    - ``required``: fields that must be present and not null; a record without one is a dead
      letter (``missing field: …``). Other fields are null when absent.
    - ``event_time``: a ``timestamp`` field: per-split watermarks (bounded out-of-orderness
      ``out_of_orderness``, idle after ``idle_timeout``); the task watermark flows through
      every step to the sink. Without it the pipeline has no watermarks.
    - ``late_records``: what happens to a record whose event time is behind a completed
      output partition's end: ``"dead_letter"`` (reason ``late``) or ``"reopen"`` (written
      to the partition, which is reported again; needs ``event_time`` and
      ``partition_by="day"``).
    - ``partition_by``: ``"day"`` — files live in ``<landing>/dt=YYYY-MM-DD/`` folders named
      after their records' event day; the day is the output partition (``dt=`` folders or a
      ``dt`` column) and the Dagster partition. ``None``: files directly in ``<landing>``,
      output and asset unpartitioned.
    - ``landing``: the folder; a relative path is under ``SLUICE_DATA_DIR``; default
      ``<SLUICE_DATA_DIR>/landing/<pipeline name>``.
    - ``start_date``: first Dagster partition (default: the earliest ``dt=`` folder found when
      the code location loads, else today).
    - ``late_records``: what happens to a record whose event day is an output partition
      already recorded complete: ``"dead_letter"`` (a dead letter with reason ``late``) or
      ``"reopen"`` (the default: written to its partition, which completes again as a new
      generation — what a file landing late for a finished day did before completeness
      existed, so nothing is diverted silently).

    Formats by extension: ``.jsonl``/``.json`` (JSON Lines), ``.csv`` (with a header line),
    either gzip-compressed (``.jsonl.gz``, ``.csv.gz``), and ``.parquet``.
    """

    schema: Mapping[str, TypeSpec]
    required: Sequence[str] = ()
    event_time: str | None = None
    partition_by: Literal["day"] | None = "day"
    landing: str | PathLike[str] | None = None
    start_date: date | str | None = None
    out_of_orderness: Duration = "5s"
    idle_timeout: Duration = "60s"
    late_records: LatePolicy = "reopen"
