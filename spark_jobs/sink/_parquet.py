"""Parquet output as a two-phase-commit sink (Flink's FileSink pattern).

Task side, :class:`ParquetSinkWriter`: record batches (the pipeline's output schema) go to
in-progress files, one per output partition (an event date's ``dt=`` folder, or the root of
an unpartitioned output), in a staging folder nobody reads; a checkpoint's pre-commit closes
them (durable, still invisible) and starts new ones. Commit side, :class:`ParquetSink`: after
the checkpoint completed in Postgres the staged files are renamed to their final names —
deterministic, so publishing twice (recovery after a crash) overwrites and never adds a
second copy.

The folders are :class:`~enumerator_service.Location` values: a local folder keeps the
rename (and every fsync) described here; on an object store (``s3://`` …), which has no
rename, a staged object is published by a server-side copy to the same deterministic final
name and then deleted (the rule and why: ``_object_store``). Entries of ``sink_transactions``
name local files by path and objects by URI.

Errors are never committed past: a failed background write (the disk full, the file system
gone read-only) is kept and fails the next pre-commit, and every staged file is verified
after it is closed — its footer read back and its row count compared with the rows written —
before its pre-commit may be acknowledged. (pyarrow's ``close()`` succeeds after a write
failed with ENOSPC and leaves a file without a footer.) A failed pre-commit fails the task:
the stage restarts from the last completed checkpoint, and the file never commits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from os import PathLike
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.engine import Connection

from enumerator_service import (
    Location,
    StagedTransaction,
    StorageOptions,
    encode_dead_letters,
    is_uri,
    open_location,
    safe_name,
)
from spark_jobs.sink._folders import fsync_path
from spark_jobs.sink._object_store import delete_object, publish_object
from spark_jobs.sink._rebuild_swap import REBUILDS_FOLDER, live_folder, rebuild_folder
from spark_jobs.sink._staged import StagedOutput, conform_batch

__all__ = [
    "SINK_NAME",
    "ParquetSink",
    "ParquetSinkWriter",
    "StagedFileError",
    "StagedOutput",
    "publish_files",
]

SINK_NAME = "parquet"
#: Arrow rows per hand-over to the writer thread (and per Parquet row group): big row groups
#: cost less per row to encode and compress; a checkpoint's pre-commit flushes the rest.
_BATCH_CHUNK = 65536


class StagedFileError(OSError):
    """A staged Parquet file that must never be published: a write into it failed, or it does
    not read back with the rows written into it. An OSError: like the disk error behind it, a
    transient fault (the task fails and its stage restarts from the last checkpoint)."""


class ParquetSinkWriter:
    """Stages one task attempt's output (record batches with exactly ``schema``).

    ``write_batch``/``count_dropped``/``dead_letter``/``pre_commit`` are called on the
    mailbox thread and never block: file I/O runs on ``io`` (one thread, so the order of
    batches and pre-commits is kept). ``dictionary``: the columns to dictionary-encode (only
    worth it where values repeat: tried on unique ids it is given up page by page, after the
    work); ``compression``: the Parquet codec. ``stage_in_place``: each file is staged at
    its final name in the table folder (a table format whose log, not a rename, makes files
    visible: Delta); ``staging_root`` is then unused.
    """

    def __init__(
        self,
        io: ThreadPoolExecutor,
        *,
        schema: pa.Schema,
        dictionary: Sequence[str],
        compression: str,
        staging_root: Location | str | PathLike[str],
        output_root: Location | str | PathLike[str],
        run_id: str,
        subtask: int,
        attempt: str,
        stage_in_place: bool = False,
    ) -> None:
        unknown = [name for name in dictionary if name not in schema.names]
        if unknown:
            raise ValueError(f"dictionary column(s) {', '.join(unknown)} are not in the output")
        self._io = io
        self._schema = schema
        self._dictionary = list(dictionary)
        self._compression = compression
        self._output = _location(output_root)
        self._staging = (
            self._output
            if stage_in_place
            else _location(staging_root).child(safe_name(run_id, "run_id"))
        )
        self._local = not self._staging.object_store
        self._prefix = f"part-{run_id}-t{subtask:03d}-{attempt}"
        self._batches: dict[str, list[pa.RecordBatch]] = {}
        self._batch_rows: dict[str, int] = {}
        self._dead: list[tuple[int, int, bytes, str]] = []
        self._dropped = 0
        #: The background writes since the last pre-commit (their outcome is checked by it).
        self._writes: list[Future[None]] = []
        # Writer thread only:
        self._error: BaseException | None = None  # the first failed write of the attempt
        self._writers: dict[str, tuple[pq.ParquetWriter, Location, Location]] = {}
        self._counts: dict[str, int] = {}
        self._sequence = 0
        self.rows_written = 0

    # -- mailbox thread -------------------------------------------------------------------

    @staticmethod
    def output_partition(day: date | None, rebuild_id: int | None) -> str:
        """The folder (relative to the output root) of a split's rows: ``""`` (the root) for
        an unpartitioned output, its day's ``dt=`` folder, or the folder of the partition
        rebuild it is a member of."""
        if day is None:
            if rebuild_id is not None:
                raise ValueError(f"rebuild {rebuild_id} of an unpartitioned output")
            return ""
        iso = day.isoformat()
        return live_folder(iso) if rebuild_id is None else rebuild_folder(iso, rebuild_id)

    def write_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        """Rows of ``batch`` (exactly the output schema) into ``partition``'s file (an
        ``output_partition`` result)."""
        batch = conform_batch(batch, self._schema, "parquet sink")
        batches = self._batches.get(partition)
        if batches is None:
            batches = self._batches[partition] = []
            self._batch_rows[partition] = 0
        batches.append(batch)
        self._batch_rows[partition] += batch.num_rows
        if self._batch_rows[partition] >= _BATCH_CHUNK:
            del self._batches[partition]
            self._batch_rows[partition] = 0
            self._submit_write(partition, batches)

    def _submit_write(self, partition: str, batches: list[pa.RecordBatch]) -> None:
        # A write that already failed fails the task now rather than at the next checkpoint
        # (the failure is kept on the writer thread either way: the pre-commit re-checks it).
        while self._writes and self._writes[0].done():
            self._writes.pop(0).result()
        self._writes.append(self._io.submit(self._write_batches, partition, batches))

    def count_dropped(self, n: int) -> None:
        """``n`` records the pipeline's steps removed (reported by the next pre-commit)."""
        self._dropped += n

    def dead_letter(self, split_id: int, offset: int, raw: bytes, reason: str) -> None:
        self._dead.append((split_id, offset, raw, reason))

    def pre_commit(self) -> Future[StagedOutput]:
        """Hand everything written so far to the writer thread, which closes the files."""
        for partition, batches in self._batches.items():
            if batches:
                self._submit_write(partition, batches)
        self._batches, self._batch_rows = {}, {}
        dead, self._dead = self._dead, []
        dropped, self._dropped = self._dropped, 0
        writes, self._writes = self._writes, []
        return self._io.submit(self._close_files, writes, dead, dropped)

    # -- writer thread --------------------------------------------------------------------

    def _write_batches(self, partition: str, batches: list[pa.RecordBatch]) -> None:
        if self._error is not None:
            return  # the attempt's output is lost already; its pre-commit reports the error
        try:
            self._write_table(partition, pa.Table.from_batches(batches, schema=self._schema))
        except BaseException as exc:
            self._error = exc
            raise

    def _write_table(self, partition: str, table: pa.Table) -> None:
        entry = self._writers.get(partition)
        if entry is None:
            self._sequence += 1
            name = f"{self._prefix}-{self._sequence:06d}.parquet"
            parts = [part for part in partition.split("/") if part]
            staged = self._staging.child(*parts, name)
            if self._local:  # (an object store has no folders to make)
                Path(staged.path).parent.mkdir(parents=True, exist_ok=True)
            writer = pq.ParquetWriter(
                staged.path,
                self._schema,
                filesystem=staged.fs,
                compression=self._compression,
                use_dictionary=self._dictionary,
            )
            final = self._output.child(*parts, name)
            entry = self._writers[partition] = (writer, staged, final)
            self._counts[partition] = 0
        entry[0].write_table(table, row_group_size=table.num_rows or None)
        self._counts[partition] += table.num_rows
        self.rows_written += table.num_rows

    def _close_files(
        self,
        writes: list[Future[None]],
        dead: list[tuple[int, int, bytes, str]],
        dropped: int,
    ) -> StagedOutput:
        """Close, verify and fsync the interval's files. Raises (and the snapshot is never
        acknowledged) when any write of the interval failed or a file does not verify; the
        files stay for ``abort``."""
        if self._error is not None:
            raise StagedFileError(f"a staged Parquet write failed: {self._error}") from self._error
        for write in writes:  # all done (they ran before us on this thread), none failed
            write.result()
        out = StagedOutput(dead_letters=encode_dead_letters(dead), dropped=dropped)
        folders: set[Path] = set()
        for partition, (writer, staged, final) in sorted(self._writers.items()):
            rows = self._counts[partition]
            try:
                # On an object store close() completes the upload: the object is durable.
                writer.close()
                _verify(staged, rows)
                # The acknowledgement promises the staged file survives a crash: its content
                # and its entry in the staging folder.
                if self._local:
                    fsync_path(Path(staged.path))
            except BaseException as exc:
                self._error = exc
                raise
            if self._local:
                folders.add(Path(staged.path).parent)
            out.files.append({"staged": staged.uri, "final": final.uri, "rows": rows})
            out.rows += rows
        for folder in sorted(folders):
            fsync_path(folder)
        self._writers = {}
        self._counts = {}
        return out

    def abort(self) -> None:
        """Writer thread: drop the in-progress files (the task is failing; closing a file
        whose writes failed may fail again, which changes nothing)."""
        for writer, staged, _final in self._writers.values():
            with contextlib.suppress(Exception):
                writer.close()
            with contextlib.suppress(OSError):  # (an unreachable store: swept later)
                delete_object(staged)
        self._writers = {}

    def close(self) -> None:
        """Writer thread: nothing is held open between pre-commits."""


def _location(value: Location | str | PathLike[str]) -> Location:
    return value if isinstance(value, Location) else open_location(value)


def _verify(staged: Location, rows: int) -> None:
    """The closed file reads back (from the store, for an object): its footer parses and
    holds exactly ``rows`` rows."""
    try:
        found = pq.read_metadata(staged.path, filesystem=staged.fs).num_rows
    except (OSError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError
        raise StagedFileError(f"staged Parquet file {staged} is unreadable: {exc}") from exc
    if found != rows:
        raise StagedFileError(f"staged Parquet file {staged} holds {found} rows, {rows} written")


def publish_files(files: Sequence[dict[str, Any]], options: StorageOptions | None = None) -> None:
    """Move staged files into place. Idempotent: an already published file is left alone.
    Local renames are made durable before returning (the caller then records them
    published); objects (URIs, opened with ``options``) are copied server-side to their
    final names and the staged objects deleted."""
    folders: set[Path] = set()
    for entry in files:
        if is_uri(entry["final"]):
            final_object = open_location(entry["final"], options)
            publish_object(
                open_location(entry["staged"], options),
                final_object,
                obsolete_ok=REBUILDS_FOLDER in final_object.path.split("/"),
            )
            continue
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
        folders.add(final.parent)
    for folder in sorted(folders):
        if folder.is_dir():  # (a swept rebuild folder is gone)
            fsync_path(folder)


class ParquetSink:
    """Commit side of the Parquet sink (coordinator and recovery). ``options``: the
    object-store client settings (endpoint, region) its URIs are opened with."""

    name = SINK_NAME

    def __init__(self, options: StorageOptions | None = None) -> None:
        self._options = options

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        # Files become visible by renaming after the transaction (publish), not inside it.
        return None

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        for txn in txns:
            publish_files(txn.staged, self._options)

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        for txn in txns:
            for entry in txn.staged:
                if is_uri(entry["staged"]):
                    delete_object(open_location(entry["staged"], self._options))
                else:
                    Path(entry["staged"]).unlink(missing_ok=True)
