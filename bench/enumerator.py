"""Split enumerator benchmark: registration, an incremental discovery tick, pull throughput.

    python bench/enumerator.py [--files 100000] [--new 1000] [--pull 10000] [--pullers 8]

Runs on the platform database of ``load_settings()`` (the embedded Postgres by default) under a
source of its own (``bench_<random>``), with landing files in a temporary folder; both are
removed at the end. Steps:

a. register ``--files`` file splits through ``SplitStore.register`` (one call);
b. an initial ``ContinuousFileEnumerator.discover()`` makes those files known (they carry historic
   modification times, spread over ~100 ``dt=YYYY-MM-DD`` folders), then ``--new`` files are
   written with the newest mtimes and ONE incremental tick is timed. A second tick over another
   ``--new`` files runs under tracemalloc to show its peak Python memory, next to the memory of
   a set of every known path (what an unbounded cursor would hold), measured in this run;
c. ``--pull`` splits are assigned to one run and ``--pullers`` threads call ``pull_splits``
   (``SLUICE_PULL_MAX_SPLITS`` small splits per request, as reader subtasks do) until it
   returns none; every split must be handed out exactly once. The same over a second run of
   the same size with one split per request (``pull_next``) is the baseline of this run;
d. a first discovery over the whole landing folder as a backlog (a second source, nothing
   registered yet) with the per-tick cap (``--cap``, default SLUICE_DISCOVERY_MAX_FILES_PER_TICK):
   the time of each tick until the backlog is drained, and that every file was registered
   exactly once. ``--uncapped`` also times the same first tick without a cap (a third source).
   ``--backlog-only`` runs this step alone (over the historic files plus ``--new`` new ones).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from _backlog import backlog_rows  # bench/ is on sys.path when run as a script
from _harness import timed, verdict
from _pulls import pull_rows
from rich.console import Console
from rich.table import Table

from enumerator_service import (
    ContinuousFileEnumerator,
    FileSplit,
    SplitStore,
    load_settings,
    modification_time,
)
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import enumerator_state, splits

console = Console(width=150)
T = TypeVar("T")

FIRST_DAY = date(2025, 1, 1)
LOOKBACK = 600.0  # the enumerator's default lookback window, seconds
HISTORIC_SPACING = 60  # seconds between the mtimes of two historic files of one folder
REGISTER_TARGET = 10.0  # seconds for --files splits
TICK_TARGET = 2.0  # seconds for one incremental tick


@dataclass(frozen=True)
class Landing:
    root: Path
    days: list[date]
    files_per_day: int


def _day_epoch(day: date) -> int:
    return int(datetime(day.year, day.month, day.day).timestamp())


def write_files(folder: Path, names: Iterator[str], first_mtime: float, spacing: float) -> int:
    """Create empty files fast (open, utime, close); file i gets mtime first + i * spacing."""
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    n = 0
    for i, name in enumerate(names):
        fd = os.open(folder / name, flags, 0o644)
        try:
            mtime = first_mtime + i * spacing
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)
        n += 1
    return n


def make_landing(root: Path, files: int) -> Landing:
    """``files`` historic files in ~100 day folders, oldest first, 60 s apart inside a day."""
    folders = max(1, min(100, files // 100))
    per_day = -(-files // folders)
    days = [FIRST_DAY + timedelta(days=d) for d in range(folders)]
    left = files
    for day in days:
        count = min(per_day, left)
        write_files(
            root / f"dt={day.isoformat()}",
            (f"part-{i:05d}.jsonl" for i in range(count)),
            _day_epoch(day),
            HISTORIC_SPACING,
        )
        left -= count
    return Landing(root, days, per_day)


def write_new(landing: Landing, tag: str, count: int) -> Path:
    """``count`` new files, newest mtimes of all, in a fresh day folder after the historic ones."""
    day = landing.days[-1] + timedelta(days=1)
    folder = landing.root / f"dt={day.isoformat()}"
    write_files(folder, (f"{tag}-{i:05d}.jsonl" for i in range(count)), time.time(), 0.0)
    return folder


def splits_of(landing: Landing, source: str) -> Iterator[FileSplit]:
    """The splits the enumerator itself would derive from the historic files."""
    for day in landing.days:
        folder = landing.root / f"dt={day.isoformat()}"
        with os.scandir(folder) as entries:
            for entry in entries:
                yield FileSplit(source, "jsonl", os.path.abspath(entry.path), 0, 0, day)


def all_paths_memory(landing: Landing) -> tuple[int, int]:
    """Bytes held by a set of every known path: what an unbounded cursor would keep."""
    tracemalloc.start()
    paths = {split.path for split in splits_of(landing, "x")}
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return len(paths), size


def traced(fn: Callable[[], T]) -> tuple[int, T]:
    """Peak Python memory allocated while ``fn`` ran (tracemalloc), and its result."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, result


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def run(args: argparse.Namespace, platform: Platform, root: Path, source: str) -> Table:
    table = Table(
        title=(
            f"Split enumerator: {args.files:,} files + {args.new:,} new, "
            f"{args.pullers} pullers over {args.pull:,} splits (source {source})"
        )
    )
    table.add_column("step", no_wrap=True)
    for column in ("measured", "target", "ratio", ""):
        table.add_column(column, justify="right")

    with console.status(f"Writing {args.files:,} landing files…"):
        seconds, landing = timed(lambda: make_landing(root, args.files))
    table.add_row("setup: write historic files (not a target)", f"{seconds:.2f} s", "", "", "")
    if args.backlog_only:
        write_new(landing, "new", args.new)
        backlog_rows(platform.engine, root, source, table, cap=args.cap, uncapped=args.uncapped)
        return table

    store = SplitStore(platform.engine)
    # a. Registration through SplitStore.register.
    found = list(splits_of(landing, source))
    with console.status(f"a. Registering {args.files:,} splits…"):
        seconds, added = timed(lambda: store.register(found))
    assert added == args.files, f"registered {added} of {args.files}"
    table.add_row(
        f"a. register {args.files:,} splits (SplitStore.register)",
        f"{seconds:.2f} s ({args.files / seconds:,.0f}/s)",
        f"<= {REGISTER_TARGET:g} s",
        f"{REGISTER_TARGET / seconds:.2f}x",
        verdict(seconds <= REGISTER_TARGET),
    )
    seconds, again = timed(lambda: store.register(found))
    assert again == 0
    found.clear()
    table.add_row(
        f"   re-register the same {args.files:,} (idempotent, 0 new)",
        f"{seconds:.2f} s",
        "",
        "",
        "",
    )

    # b. Discovery ticks.
    # The historic files got made-up mtimes (utime sets their ctime to now): order by them.
    enumerator = ContinuousFileEnumerator(
        platform.engine,
        source,
        landing.root,
        lookback_seconds=LOOKBACK,
        file_time=modification_time,
    )
    with console.status("b. Initial discovery…"):
        seconds, initial = timed(enumerator.discover)
    assert initial.splits_registered == 0, "the historic files were registered in step a"
    table.add_row(
        f"   initial discover() over {initial.files_seen:,} known files "
        f"(cursor: {len(initial.cursor['recent_paths']):,} paths; not a target)",
        f"{seconds:.2f} s",
        "",
        "",
        "",
    )
    write_new(landing, "new", args.new)
    with console.status("b. Incremental tick…"):
        seconds, tick = timed(enumerator.discover)
    assert tick.splits_registered == args.new, tick
    table.add_row(
        f"b. incremental tick: {tick.files_seen:,} files listed, {args.new:,} new",
        f"{seconds:.2f} s",
        f"<= {TICK_TARGET:g} s",
        f"{TICK_TARGET / seconds:.2f}x",
        verdict(seconds <= TICK_TARGET),
    )
    window = args.new  # only the new files are inside the lookback window of the tick
    cursor_size = len(tick.cursor["recent_paths"])
    table.add_row(
        "   cursor after the tick (recent paths)",
        f"{cursor_size:,}",
        f"<= {window:,} in window",
        f"{cursor_size / tick.files_seen:.1%} of listed",
        verdict(cursor_size <= window),
    )

    known, known_bytes = all_paths_memory(landing)
    write_new(landing, "newer", args.new)
    with console.status("b. Traced tick…"):
        peak, traced_tick = traced(enumerator.discover)
    assert traced_tick.splits_registered == args.new, traced_tick
    window2 = 2 * args.new  # both batches of new files are inside the window now
    cursor2 = len(traced_tick.cursor["recent_paths"])
    table.add_row(
        f"   set of all {known:,} known paths (unbounded cursor, reference)",
        mib(known_bytes),
        "",
        "",
        "",
    )
    table.add_row(
        f"   peak Python memory of a 2nd tick ({args.new:,} newer files, tracemalloc)",
        mib(peak),
        f"< {mib(known_bytes)}",
        f"{peak / known_bytes:.2f}x",
        verdict(peak < known_bytes),
    )
    table.add_row(
        "   cursor after the 2nd tick (recent paths)",
        f"{cursor2:,}",
        f"<= {window2:,} in window",
        "",
        verdict(cursor2 <= window2),
    )

    # c. Assignment throughput (bench/_pulls.py).
    with console.status(f"c. {args.pullers} pullers…"):
        pull_rows(
            table,
            platform,
            source,
            landing.days,
            landing.files_per_day,
            pull=args.pull,
            pullers=args.pullers,
            max_splits=args.pull_max_splits,
            max_bytes=args.pull_max_bytes,
        )
    backlog_rows(platform.engine, landing.root, source, table, cap=args.cap, uncapped=args.uncapped)
    return table


def cleanup(platform: Platform, source: str) -> int:
    deleted = 0
    with platform.engine.begin() as conn:
        for name in (source, f"{source}_backlog", f"{source}_uncapped"):
            deleted += conn.execute(sa.delete(splits).where(splits.c.source == name)).rowcount
            conn.execute(sa.delete(enumerator_state).where(enumerator_state.c.source == name))
    return deleted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100_000, help="historic (known) files")
    parser.add_argument("--new", type=int, default=1_000, help="new files per tick")
    parser.add_argument("--pull", type=int, default=10_000, help="splits assigned and pulled")
    parser.add_argument("--pullers", type=int, default=8, help="concurrent pulling threads")
    parser.add_argument(
        "--cap", type=int, default=None, help="files per tick in step d (default: the setting)"
    )
    parser.add_argument(
        "--uncapped", action="store_true", help="step d: also time one uncapped first tick"
    )
    parser.add_argument("--backlog-only", action="store_true", help="run step d alone")
    args = parser.parse_args()
    if args.files < 1 or args.new < 1 or args.pullers < 1 or (args.cap or 1) < 1:
        parser.error("--files, --new, --pullers and --cap must be positive")
    args.pull = min(args.pull, args.files)

    settings = load_settings()
    args.cap = args.cap or settings.discovery_max_files_per_tick
    args.pull_max_splits = settings.pull_max_splits
    args.pull_max_bytes = settings.pull_max_bytes
    platform = open_platform(settings)
    source = f"bench_{uuid.uuid4().hex[:12]}"
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    try:
        console.print(run(args, platform, root, source))
    finally:
        with console.status("Cleaning up…"):
            deleted = cleanup(platform, source)
            shutil.rmtree(root, ignore_errors=True)
        platform.close()
    console.print(f"cleaned up: {deleted:,} split rows of {source}, {root}")


if __name__ == "__main__":
    main()
