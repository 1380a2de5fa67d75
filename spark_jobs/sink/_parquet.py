"""Parquet output of enriched events as a two-phase-commit sink (Flink's FileSink pattern).

Task side, :class:`ParquetSinkWriter`: rows go to in-progress files, one per event date, in
a staging folder nobody reads; a checkpoint's pre-commit closes them (durable, still
invisible) and starts new ones. Commit side, :class:`ParquetSink`: after the checkpoint
completed in Postgres the staged files are renamed to their final names — deterministic, so
publishing twice (recovery after a crash) overwrites and never adds a second copy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.engine import Connection

from enumerator_service._checkpoint_store import StagedTransaction, encode_dead_letters
from spark_jobs.sink._folders import fsync_path
from spark_jobs.sink._rebuild_swap import REBUILDS_FOLDER, live_folder, rebuild_folder

__all__ = [
    "ENRICHED_SCHEMA",
    "SINK_NAME",
    "ParquetSink",
    "ParquetSinkWriter",
    "StagedOutput",
    "publish_files",
]

ENRICHED_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("amount", pa.float64(), nullable=False),
        pa.field("user_name", pa.string()),
        pa.field("user_country", pa.string()),
        pa.field("user_tier", pa.string()),
        pa.field("user_signup_time", pa.timestamp("us", tz="UTC")),
    ]
)
SINK_NAME = "parquet"
#: Dictionary encoding only where values repeat: tried on unique ids it is given up page by
#: page, after the work (half the cost of writing a row, bench/e2e.py, and larger files).
_DICTIONARY_COLUMNS = ["event_type", "user_country", "user_tier"]
_CHUNK = 8192  # rows per hand-over to the writer thread (and per Parquet row group)
#: Arrow rows per hand-over to the writer thread (and per Parquet row group): big row groups
#: cost less per row to encode and compress; a checkpoint's pre-commit flushes the rest.
_BATCH_CHUNK = 65536


@dataclass(slots=True)
class StagedOutput:
    """What one pre-commit staged: files (staged → final path, rows) and dead letters."""

    files: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.files and not self.dead_letters


class ParquetSinkWriter:
    """Stages one task attempt's output. ``write``/``dead_letter``/``pre_commit`` are called
    on the mailbox thread and never block: file I/O runs on ``io`` (one thread, so the
    order of chunks and pre-commits is kept)."""

    def __init__(
        self,
        io: ThreadPoolExecutor,
        *,
        staging_root: Path,
        output_root: Path,
        run_id: str,
        subtask: int,
        attempt: str,
    ) -> None:
        self._io = io
        self._staging = staging_root / run_id
        self._output = output_root
        self._prefix = f"part-{run_id}-t{subtask:03d}-{attempt}"
        self._buffers: dict[str, list[tuple[Any, ...]]] = {}
        self._batches: dict[str, list[pa.RecordBatch]] = {}
        self._batch_rows: dict[str, int] = {}
        self._dead: list[tuple[int, int, bytes, str]] = []
        # Writer thread only:
        self._writers: dict[str, tuple[pq.ParquetWriter, Path, Path]] = {}
        self._counts: dict[str, int] = {}
        self._sequence = 0
        self.rows_written = 0

    # -- mailbox thread -------------------------------------------------------------------

    @staticmethod
    def output_partition(day: date | None, rebuild_id: int | None) -> str:
        """The folder (relative to the output root) of a split's rows: its day's partition,
        or the folder of the partition rebuild it is a member of."""
        iso = day.isoformat() if day is not None else "__unknown__"
        return live_folder(iso) if rebuild_id is None else rebuild_folder(iso, rebuild_id)

    def write(self, partition: str, row: tuple[Any, ...]) -> None:
        """Buffer ``row`` for ``partition`` (an ``output_partition`` result)."""
        buffer = self._buffers.get(partition)
        if buffer is None:
            buffer = self._buffers[partition] = []
        buffer.append(row)
        if len(buffer) >= _CHUNK:
            self._buffers[partition] = []
            self._io.submit(self._write_chunk, partition, buffer)

    def write_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        """Rows of ``batch`` (``ENRICHED_SCHEMA``) into ``partition``'s file (an
        ``output_partition`` result)."""
        batches = self._batches.get(partition)
        if batches is None:
            batches = self._batches[partition] = []
            self._batch_rows[partition] = 0
        batches.append(batch)
        self._batch_rows[partition] += batch.num_rows
        if self._batch_rows[partition] >= _BATCH_CHUNK:
            del self._batches[partition]
            self._batch_rows[partition] = 0
            self._io.submit(self._write_batches, partition, batches)

    def dead_letter(self, split_id: int, offset: int, raw: bytes, reason: str) -> None:
        self._dead.append((split_id, offset, raw, reason))

    def pre_commit(self) -> Future[StagedOutput]:
        """Hand everything written so far to the writer thread, which closes the files."""
        for partition, buffer in self._buffers.items():
            if buffer:
                self._io.submit(self._write_chunk, partition, buffer)
        self._buffers = {}
        for partition, batches in self._batches.items():
            if batches:
                self._io.submit(self._write_batches, partition, batches)
        self._batches, self._batch_rows = {}, {}
        dead, self._dead = self._dead, []
        return self._io.submit(self._close_files, dead)

    # -- writer thread --------------------------------------------------------------------

    def _write_chunk(self, partition: str, rows: list[tuple[Any, ...]]) -> None:
        columns = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(columns, ENRICHED_SCHEMA, strict=True)],
            schema=ENRICHED_SCHEMA,
        )
        self._write_table(partition, table)

    def _write_batches(self, partition: str, batches: list[pa.RecordBatch]) -> None:
        self._write_table(partition, pa.Table.from_batches(batches, schema=ENRICHED_SCHEMA))

    def _write_table(self, partition: str, table: pa.Table) -> None:
        entry = self._writers.get(partition)
        if entry is None:
            self._sequence += 1
            name = f"{self._prefix}-{self._sequence:06d}.parquet"
            staged = self._staging / partition / name
            staged.parent.mkdir(parents=True, exist_ok=True)
            writer = pq.ParquetWriter(
                staged, ENRICHED_SCHEMA, compression="zstd", use_dictionary=_DICTIONARY_COLUMNS
            )
            entry = self._writers[partition] = (writer, staged, self._output / partition / name)
            self._counts[partition] = 0
        entry[0].write_table(table, row_group_size=table.num_rows or None)
        self._counts[partition] += table.num_rows
        self.rows_written += table.num_rows

    def _close_files(self, dead: list[tuple[int, int, bytes, str]]) -> StagedOutput:
        out = StagedOutput(dead_letters=encode_dead_letters(dead))
        for partition, (writer, staged, final) in sorted(self._writers.items()):
            writer.close()
            fsync_path(staged)  # the acknowledgement promises the staged file survives a crash
            rows = self._counts[partition]
            out.files.append({"staged": str(staged), "final": str(final), "rows": rows})
            out.rows += rows
        self._writers = {}
        self._counts = {}
        return out

    def abort(self) -> None:
        """Writer thread: drop the in-progress files (the task is failing)."""
        for writer, staged, _final in self._writers.values():
            writer.close()
            staged.unlink(missing_ok=True)
        self._writers = {}

    def close(self) -> None:
        """Writer thread: nothing is held open between pre-commits."""


def publish_files(files: Sequence[dict[str, Any]]) -> None:
    """Move staged files into place. Idempotent: an already published file is left alone."""
    for entry in files:
        staged, final = Path(entry["staged"]), Path(entry["final"])
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staged, final)
        except FileNotFoundError:
            # Published already (by us before a crash, or by a concurrent recovery). A
            # rebuild's folder may since have been swapped live (the file moved with it) or
            # abandoned and swept (the file was obsolete).
            if not final.exists() and REBUILDS_FOLDER not in final.parts:
                raise FileNotFoundError(
                    f"committed output is lost: neither {staged} nor {final} exists"
                ) from None


class ParquetSink:
    """Commit side of the Parquet sink (coordinator and recovery)."""

    name = SINK_NAME

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        # Files become visible by renaming after the transaction (publish), not inside it.
        return None

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        for txn in txns:
            publish_files(txn.staged)

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        for txn in txns:
            for entry in txn.staged:
                Path(entry["staged"]).unlink(missing_ok=True)
