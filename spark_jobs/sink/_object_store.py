"""The Parquet sink on an object store (S3; GCS, ADLS, HDFS through the same ``pyarrow.fs``
calls): commit without rename, rebuild a day without a folder swap.

**Commit rule.** An object store has no rename and no atomic folder operation; what it does
have is the atomic appearance of one whole object (a PUT, a completed multipart upload, a
server-side copy: a reader sees no object or all of it, never part) and strong
read-after-write consistency (S3 since 2020). So:

1. *Stage* (task side, pre-commit): each checkpoint interval's file is uploaded to
   ``<parent>/_staging/<table>/<run>/<partition>/<name>`` — outside the table prefix, so no
   reader lists it — then verified: its footer read back from the store and its row count
   compared with the rows written. The upload is complete when ``close()`` returns, which is
   the object store's durability (there is nothing to fsync).
2. *Commit* (coordinator): the ``sink_transactions`` row commits in Postgres with the
   checkpoint, naming the staged object and its final object ``<table>/<partition>/<name>``.
   The name is deterministic (run, subtask, attempt, sequence): never reused by other output.
3. *Publish* (after the Postgres commit; and again by recovery after a crash): a server-side
   copy of the staged object to its final name, then the staged object is deleted. The copy
   is idempotent — publishing again writes the same bytes under the same name, so a reader
   never sees a duplicate and a crash between copy and delete only repeats the copy. A
   staged object that is gone means it was published before (its final object exists), or a
   rebuild that since finished or was abandoned took it along; anything else is reported as
   lost output, never ignored.

Why not the alternatives: writing the final object directly at pre-commit would show
uncommitted rows to readers (the checkpoint may still abort); a manifest read last would
need every reader (Spark, pyarrow, DuckDB over ``dt=`` folders) to read Sluice's manifest;
conditional PUT (``If-None-Match``) only guards against a second writer of the same name,
which deterministic names and the single publisher already exclude. The copy costs no data
transfer through Sluice (it is server-side) and keeps the local two-phase protocol as it is.
A failed publish (endpoint down) fails the commit visibly; the transaction stays committed
and unpublished in Postgres and the next run's recovery publishes it.

**Rebuilding a day** (``--replace``, a Dagster re-materialisation). The members publish into
``<table>/_rebuilds/dt=D/<r>/`` (a ``_`` prefix: invisible to readers of the table) as on a
local disk. The swap (``swap_objects``), under a Postgres advisory lock of the rebuild and
only while it is SWAPPING:

a. if ``dt=D/_SLUICE_REBUILD`` names *r*, the swap happened: nothing to do;
b. every data object of the rebuild folder is copied (server-side) to ``dt=D/`` under its
   own name (names are unique per run: they never collide with the previous generation's);
c. every other object of ``dt=D/`` — the previous generation — is deleted;
d. the marker ``dt=D/_SLUICE_REBUILD`` = *r* is written last.

Then the rebuild is DONE in Postgres and its folder is deleted. Each step is idempotent and
the rebuild folder stays whole until DONE, so a crash anywhere is finished by the next
``finish_rebuilds`` (any run's recovery) and ends in exactly the new output for the day:
never a mix, never nothing. *What readers can observe while a swap runs* (seconds for a
day of a few hundred files): between b and c a listing of ``dt=D/`` may hold the new
generation's files plus some or all of the previous generation's (rows of both: a day
counted twice), never fewer than one whole generation; from d on, exactly the new one. A
reader that must not see the overlap waits for the marker (or for the Dagster
materialisation, which is reported after the swap).

Threading: functions block on the store; call from the coordinator, the driver, a writer
thread — never a mailbox thread.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
from collections.abc import Iterator

import pyarrow.fs as pafs
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import ConfigError, Location, ServerUnreachable

__all__ = [
    "check_reachable",
    "delete_object",
    "file_paths",
    "publish_object",
    "remove_folder",
    "subfolders",
    "swap_lock",
    "swap_objects",
    "write_text",
]

_log = logging.getLogger(__name__)


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def publish_object(staged: Location, final: Location, *, obsolete_ok: bool) -> None:
    """Copy ``staged`` to ``final`` server-side, then delete ``staged`` (idempotent).

    A missing staged object was published before: fine if ``final`` exists, or
    ``obsolete_ok`` (a rebuild's object whose folder was swapped in or abandoned since);
    FileNotFoundError otherwise. Any other failure is an OSError naming ``final``."""
    try:
        final.fs.copy_file(staged.path, final.path)
    except OSError as exc:
        try:
            gone = not _exists(staged.fs, staged.path)
        except OSError:
            gone = False
        if not gone:
            raise OSError(f"publishing {final.uri} failed: {_one_line(exc)}") from exc
        if not obsolete_ok and not _exists(final.fs, final.path):
            raise FileNotFoundError(
                f"committed output is lost: neither {staged.uri} nor {final.uri} exists"
            ) from None
        return
    delete_object(staged)


def delete_object(location: Location) -> None:
    """Delete one object or file; a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        location.fs.delete_file(location.path)


def remove_folder(location: Location) -> None:
    """Delete a folder (every object under the prefix); a missing one is fine."""
    with contextlib.suppress(FileNotFoundError):
        location.fs.delete_dir(location.path)


def file_paths(location: Location) -> list[str]:
    """The files directly in ``location`` (paths on its file system), sorted; none if it
    does not exist. Paged listing on an object store (pyarrow pages through ListObjectsV2)."""
    selector = pafs.FileSelector(location.path, allow_not_found=True, recursive=False)
    return sorted(
        info.path for info in location.fs.get_file_info(selector) if info.type == pafs.FileType.File
    )


def subfolders(location: Location) -> list[str]:
    """The names of the folders (common prefixes) directly in ``location``."""
    selector = pafs.FileSelector(location.path, allow_not_found=True, recursive=False)
    return sorted(
        info.base_name
        for info in location.fs.get_file_info(selector)
        if info.type == pafs.FileType.Directory
    )


def write_text(location: Location, text: str) -> None:
    """One small object (a single PUT: it appears whole)."""
    with location.fs.open_output_stream(location.path) as out:
        out.write(text.encode())


def _read_text(location: Location) -> str | None:
    try:
        with location.fs.open_input_stream(location.path) as handle:
            return bytes(handle.read()).decode()
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def swap_lock(engine: Engine, rebuild_id: int) -> Iterator[None]:
    """A session-level advisory lock of one rebuild's swap (released when the block ends, or
    when the process dies with its connection): two processes finishing the same rebuild
    take turns, and the second finds it DONE."""
    key = {"key": f"sluice.rebuild-swap:{rebuild_id}"}
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(hashtextextended(:key, 0))"), key)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"), key)
            conn.commit()


def swap_objects(new: Location, live: Location, rebuild_id: int, marker: str) -> None:
    """Make the data objects of ``new`` exactly those of ``live`` (steps a-d of the module
    docstring). Call under :func:`swap_lock`, while the rebuild is SWAPPING."""
    done = live.child(marker)
    if _read_text(done) == str(rebuild_id):
        return  # (a) swapped before a crash
    fs = live.fs
    wanted = [path for path in file_paths(new) if not _hidden(posixpath.basename(path))]
    names = {posixpath.basename(path) for path in wanted}
    for path in wanted:  # (b)
        fs.copy_file(path, live.child(posixpath.basename(path)).path)
    for path in file_paths(live):  # (c): the previous generation, its marker included
        if posixpath.basename(path) not in names:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(path)
    write_text(done, str(rebuild_id))  # (d)


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


_AWS_ERROR = re.compile(r"AWS Error (\w+)")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def check_reachable(location: Location, setting: str) -> None:
    """Fail fast, in one line naming ``setting`` and the URI, when an object-store folder
    cannot be used: the endpoint unreachable, the credentials refused, the bucket missing.
    A local folder is not checked here (it is created when written)."""
    if not location.object_store:
        return
    # A bucket (S3, GCS, ADLS container) is checked itself; an HDFS folder's file system is.
    bucketed = location.scheme != "hdfs"
    bucket = location.path.split("/", 1)[0] if bucketed else location.path
    try:
        info = location.fs.get_file_info(bucket)
    except OSError as exc:
        kind = _AWS_ERROR.search(str(exc))
        code = kind.group(1) if kind else ""
        if code == "NETWORK_CONNECTION":
            why = "the endpoint is unreachable (SLUICE_S3_ENDPOINT_URL, network)"
        elif code in ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH"):
            why = (
                "the credentials were refused (standard chain: AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance role)"
            )
        else:
            why = _one_line(exc)
        error = ServerUnreachable if code == "NETWORK_CONNECTION" else ConfigError
        raise error(setting, f"{location.uri}: {why}") from None
    if bucketed and info.type == pafs.FileType.NotFound:
        raise ConfigError(setting, f"{location.uri}: bucket {bucket!r} does not exist")
