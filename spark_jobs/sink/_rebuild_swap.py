"""The file side of partition rebuilds: where a rebuild's output goes, and the swap.

A member split of rebuild *r* of day D publishes into ``<output>/_rebuilds/dt=D/<r>/`` (a
``_`` folder: invisible to Spark and pyarrow readers of the table). Once every member
completed, :func:`finish_rebuilds` exchanges that folder with ``<output>/dt=D`` in one
``renameat2(RENAME_EXCHANGE)`` and deletes what it swapped out.

Crash safety: the swap is idempotent. Before exchanging, a marker file ``_SLUICE_REBUILD``
naming *r* is written into the rebuild's folder, so after a crash the live folder itself
says whether the exchange happened; the Postgres status (SWAPPING → DONE) is only advanced
after the files are in place.

On an object store (no rename, no folder) the same steps run with a copy-then-delete swap
under an advisory lock instead of the exchange (``_object_store.swap_objects``: its docstring
says what a reader can observe while it runs); the marker is written last there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from os import PathLike
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import (
    Location,
    Rebuild,
    RebuildStatus,
    RebuildStore,
    TransactionalSink,
    open_location,
    partition_rebuilds,
    publish_committed,
)
from spark_jobs.sink._folders import exchange_folders, fsync_path
from spark_jobs.sink._object_store import remove_folder, subfolders, swap_lock, swap_objects

__all__ = ["MARKER", "REBUILDS_FOLDER", "finish_rebuilds", "live_folder", "rebuild_folder"]

_log = logging.getLogger(__name__)

REBUILDS_FOLDER = "_rebuilds"
#: In a partition folder: the id of the rebuild whose output it is.
MARKER = "_SLUICE_REBUILD"


def live_folder(day: str) -> str:
    """The partition folder of ``day`` (ISO date), relative to the output root."""
    return f"dt={day}"


def rebuild_folder(day: str, rebuild_id: int) -> str:
    """Where the members of rebuild ``rebuild_id`` of ``day`` publish, relative to the root."""
    return f"{REBUILDS_FOLDER}/dt={day}/{rebuild_id}"


def finish_rebuilds(
    engine: Engine,
    output_root: Location | str | PathLike[str] | None,
    sinks: Mapping[str, TransactionalSink],
    *,
    source: str,
    folders: bool = True,
) -> list[Rebuild]:
    """Swap in every ready rebuild of ``source``; returns the ones now live. Safe to call at
    any time, from any process, any number of times.

    ``folders`` False (an upsert table sink; ``output_root`` may then be None): the members'
    rows replaced the previous ones by key as they committed; only the bookkeeping (step 4)
    is left to do.
    """
    if output_root is None:
        if folders:
            raise ValueError("a folder swap needs the output folder")
        output_root = Path(".")  # never used: no folder is touched
    root = output_root if isinstance(output_root, Location) else open_location(output_root)
    if root.object_store:
        return _finish_on_object_store(engine, root, sinks, source=source, folders=folders)
    output_root = root.local_path
    store = RebuildStore(engine)
    ready = store.ready(source)
    swapped = []
    if ready:
        # Step 1: committed output reaches its folder first — the previous generation's into
        # the live folder it is about to leave, the members' into the rebuild folder.
        publish_committed(engine, sinks)
    for rebuild in ready:
        # Step 2: SWAPPING (re-checks, under the lock, that every member completed).
        if not store.begin_swap(rebuild):
            continue
        day = rebuild.partition_key.isoformat()
        new, live = output_root / rebuild_folder(day, rebuild.id), output_root / live_folder(day)
        # Step 3: exchange the folders (skipped if a crash came after it).
        if folders:
            _swap(new, live, rebuild.id)
        # Step 4: DONE; the previous generation's dead letters go, HELD splits are released.
        store.end_swap(rebuild)
        # Step 5: what was swapped out.
        if folders:
            shutil.rmtree(new, ignore_errors=True)
        swapped.append(rebuild)
        _log.info("rebuild %d of %s is live", rebuild.id, day)
    if folders:
        _sweep(store, output_root)
    return swapped


def _finish_on_object_store(
    engine: Engine,
    root: Location,
    sinks: Mapping[str, TransactionalSink],
    *,
    source: str,
    folders: bool,
) -> list[Rebuild]:
    """:func:`finish_rebuilds` on an object store: steps 1-5 the same, step 3 a swap of
    objects under the rebuild's advisory lock (re-checked: still SWAPPING once held)."""
    store = RebuildStore(engine)
    ready = store.ready(source)
    swapped = []
    if ready:
        publish_committed(engine, sinks)
    for rebuild in ready:
        if not store.begin_swap(rebuild):
            continue
        day = rebuild.partition_key.isoformat()
        new, live = (
            root.child(*rebuild_folder(day, rebuild.id).split("/")),
            root.child(live_folder(day)),
        )
        with swap_lock(engine, rebuild.id):
            if _status_of(engine, rebuild.id) != RebuildStatus.SWAPPING:
                continue  # another process finished it while we waited
            if folders:
                swap_objects(new, live, rebuild.id, MARKER)
            store.end_swap(rebuild)
            if folders:
                remove_folder(new)
        swapped.append(rebuild)
        _log.info("rebuild %d of %s is live", rebuild.id, day)
    if folders:
        _sweep_objects(store, root)
    return swapped


def _status_of(engine: Engine, rebuild_id: int) -> str | None:
    with engine.connect() as conn:
        status: str | None = conn.execute(
            sa.select(partition_rebuilds.c.status).where(partition_rebuilds.c.id == rebuild_id)
        ).scalar_one_or_none()
    return status


def _sweep_objects(store: RebuildStore, root: Location) -> None:
    """Delete the folders of finished or abandoned rebuilds (object-store listing)."""
    rebuilds = root.child(REBUILDS_FOLDER)
    folders = {
        (day, name): int(name)
        for day in subfolders(rebuilds)
        for name in subfolders(rebuilds.child(day))
        if name.isdigit()
    }
    finished = store.finished_ids(sorted(set(folders.values())))
    for (day, name), rebuild_id in folders.items():
        if rebuild_id in finished:
            remove_folder(rebuilds.child(day, name))


def _swap(new: Path, live: Path, rebuild_id: int) -> None:
    marker = str(rebuild_id)
    if (live / MARKER).is_file() and (live / MARKER).read_text() == marker:
        return  # exchanged before a crash
    new.mkdir(parents=True, exist_ok=True)  # a partition without rows is an empty folder
    _write_durably(new / MARKER, marker)
    live.parent.mkdir(parents=True, exist_ok=True)
    if not live.exists():
        os.rename(new, live)
    elif not exchange_folders(new, live):
        # No atomic exchange here (non-Linux): a moment without the folder, never a mix.
        aside = new.with_name(f"{new.name}.old")
        os.rename(live, aside)
        os.rename(new, live)
        os.rename(aside, new)
    fsync_path(live.parent)
    fsync_path(new.parent)


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(path.parent)


def _sweep(store: RebuildStore, output_root: Path) -> None:
    """Delete folders of finished or abandoned rebuilds (left by a crash or an abandon)."""
    root = output_root / REBUILDS_FOLDER
    if not root.is_dir():
        return
    folders = {
        folder: int(folder.name.split(".")[0])
        for day in root.iterdir()
        if day.is_dir()
        for folder in day.iterdir()
        if folder.name.split(".")[0].isdigit()
    }
    finished = store.finished_ids(sorted(set(folders.values())))
    for folder, rebuild_id in folders.items():
        if rebuild_id in finished:
            shutil.rmtree(folder, ignore_errors=True)
    for day in [root, *root.iterdir()][::-1]:  # day folders first, then the root
        with contextlib.suppress(OSError):
            day.rmdir()  # only when empty
