"""Step d of ``bench/enumerator.py``: a first discovery tick over a large backlog, capped.

A Dagster sensor tick must end well within Dagster's 60 s evaluation limit; this step shows
how long capped ticks take over a whole landing folder nobody has registered yet, how many
ticks drain it, and that every file ends up registered exactly once.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from _harness import timed, verdict  # bench/ is on sys.path when run as a script
from rich.console import Console
from rich.table import Table

from enumerator_service import ContinuousFileEnumerator, DiscoveryResult, modification_time
from enumerator_service._schema import splits

__all__ = ["CAPPED_TICK_TARGET", "backlog_rows"]

console = Console(width=150)
LOOKBACK = 600.0  # the enumerator's default lookback window, seconds
CAPPED_TICK_TARGET = 15.0  # seconds for any capped tick: a quarter of Dagster's 60 s limit


def backlog_rows(
    engine: sa.Engine, root: Path, source: str, table: Table, *, cap: int, uncapped: bool
) -> None:
    """Step d: the whole landing folder under ``root`` as a first tick's backlog of a new
    source (``<source>_backlog``), drained tick by tick with ``cap`` files per tick; with
    ``uncapped``, the same first tick without a cap too (``<source>_uncapped``)."""
    enumerator = ContinuousFileEnumerator(
        engine,
        f"{source}_backlog",
        root,
        lookback_seconds=LOOKBACK,
        max_files_per_tick=cap,
        file_time=modification_time,  # made-up mtimes (utime sets the ctime to now)
    )
    ticks: list[tuple[float, DiscoveryResult]] = []
    while not ticks or not ticks[-1][1].complete:
        with console.status(f"d. Backlog tick {len(ticks) + 1}…"):
            ticks.append(timed(enumerator.discover))
    listed = ticks[0][1].files_seen
    seconds = [t for t, _ in ticks]
    registered = sum(result.splits_registered for _, result in ticks)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(splits.c.uri))).where(
                splits.c.source == f"{source}_backlog"
            )
        ).one()
    slowest = max(seconds)
    table.add_row(
        f"d. first tick over a backlog of {listed:,} files, cap {cap:,} per tick",
        f"{seconds[0]:.2f} s",
        f"<= {CAPPED_TICK_TARGET:g} s",
        f"{CAPPED_TICK_TARGET / seconds[0]:.2f}x",
        verdict(seconds[0] <= CAPPED_TICK_TARGET),
    )
    table.add_row(
        f"   {len(ticks)} ticks drain it: slowest / mean / last (backlog 0) tick",
        f"{slowest:.2f} / {sum(seconds) / len(seconds):.2f} / {seconds[-1]:.2f} s",
        f"<= {CAPPED_TICK_TARGET:g} s",
        f"{CAPPED_TICK_TARGET / slowest:.2f}x",
        verdict(slowest <= CAPPED_TICK_TARGET),
    )
    table.add_row(
        "   backlog after each tick",
        ", ".join(f"{result.backlog_files:,}" for _, result in ticks[:4])
        + (", …" if len(ticks) > 4 else ""),
        "",
        "",
        "",
    )
    once = rows[0] == rows[1] == registered == listed
    table.add_row(
        "   registered exactly once (rows, distinct files, sum over ticks)",
        f"{rows[0]:,} / {rows[1]:,} / {registered:,}",
        f"{listed:,}",
        "",
        verdict(once),
    )
    if uncapped:
        reference = ContinuousFileEnumerator(
            engine,
            f"{source}_uncapped",
            root,
            lookback_seconds=LOOKBACK,
            file_time=modification_time,
        )
        with console.status("d. Uncapped first tick…"):
            seconds_all, result = timed(reference.discover)
        table.add_row(
            f"   reference: the same first tick without a cap ({result.splits_registered:,} new)",
            f"{seconds_all:.2f} s",
            "",
            "",
            "",
        )
