"""Step c of ``bench/enumerator.py``: how fast reader subtasks get their splits.

Several puller threads (one pooled connection each, as reader subtasks hold) ask the split
store for splits until none is left: with batched requests (``pull_splits``, the settings'
``pull_max_splits`` / ``pull_max_bytes``, as reader subtasks ask) over the target run, and
with one split per request (``pull_next``) over a second run of the same size — the baseline
of the same invocation — then batched over a 10x smaller run (cost per pull vs run size).
Every run must hand out each split exactly once.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from datetime import date

from _harness import timed, verdict
from rich.table import Table

from enumerator_service import SplitStore
from enumerator_service._database import connect_engine
from enumerator_service._operations import Platform

__all__ = ["PULL_TARGET", "pull_all", "pull_rows"]

PULL_TARGET = 5_000.0  # splits/s: 8 pullers, batched requests, 10,000 small splits


def pull_all(
    platform: Platform, run_id: str, pullers: int, max_splits: int, max_bytes: int
) -> tuple[float, list[list[int]]]:
    """``pullers`` threads call pull_splits until none is left; seconds and ids per puller."""
    # Each reader subtask would hold its own connection: one pooled connection per puller.
    engine = connect_engine(platform.url, pool_size=pullers)
    store = SplitStore(engine)
    got: list[list[int]] = [[] for _ in range(pullers)]
    errors: list[BaseException] = []
    start_line = threading.Barrier(pullers + 1)

    def pull(subtask: int) -> None:
        mine = got[subtask]
        start_line.wait()
        try:
            while batch := store.pull_splits(
                run_id, subtask, 60.0, max_splits=max_splits, max_bytes=max_bytes
            ):
                mine.extend(a.split_id for a in batch)
        except BaseException as exc:  # reported after join
            errors.append(exc)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(pullers)]
    for t in threads:
        t.start()
    start_line.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    engine.dispose()
    if errors:
        raise errors[0]
    return seconds, got


def pull_rows(
    table: Table,
    platform: Platform,
    source: str,
    days: Sequence[date],
    per_day: int,
    *,
    pull: int,
    pullers: int,
    max_splits: int,
    max_bytes: int,
) -> None:
    """Add step c's rows to ``table``; the historic ``days`` of ``source`` hold the splits."""
    store = SplitStore(platform.engine)
    n = -(-pull // per_day)
    target, baseline = days[:n], days[n : 2 * n]
    small = days[2 * n : 2 * n + max(1, n // 10)]
    batched = f"pull_splits, <= {max_splits} splits / {max_bytes / 2**20:g} MiB per request"
    rates: dict[str, float] = {}
    for label, run_days, splits_per_pull in (
        ("c.", target, max_splits),
        ("baseline", baseline, 1),
        ("small", small, max_splits),
    ):
        if not run_days:
            table.add_row(f"   ({label}: not enough historic files, raise --files)", "", "", "", "")
            continue
        run_id = f"{source}_{label.strip('.')}_{len(run_days)}d"
        seconds, assigned = timed(
            functools.partial(
                store.assign_to_run, run_id, source, lease_seconds=600, partition_keys=run_days
            )
        )
        pull_seconds, got = pull_all(platform, run_id, pullers, splits_per_pull, max_bytes)
        ids = [i for per in got for i in per]
        assert len(ids) == assigned == len(set(ids)), "a split was lost or duplicated"
        rate = rates[label] = assigned / pull_seconds
        measured = f"{rate:,.0f}/s ({pull_seconds:.2f} s)"
        table.add_row(
            f"   assign_to_run: {assigned:,} splits ({len(run_days)} days) to one run",
            f"{seconds:.2f} s",
            "",
            "",
            "",
        )
        if label == "c.":
            table.add_row(
                f"c. {pullers} pullers, {batched}, {assigned:,} splits",
                measured,
                f">= {PULL_TARGET:,.0f}/s",
                f"{rate / PULL_TARGET:.2f}x",
                verdict(rate >= PULL_TARGET),
            )
        elif label == "baseline":
            ratio = f"{rates['c.'] / rate:.1f}x batched" if "c." in rates else ""
            table.add_row(
                f"   baseline: same, pull_next (one split per request), {assigned:,} splits",
                measured,
                "",
                ratio,
                "",
            )
        else:
            table.add_row(
                f"   batched, {assigned:,} splits in the run (diagnostic: cost vs run size)",
                measured,
                "",
                "",
                "",
            )
        busy = sum(1 for per in got if per)
        table.add_row(
            f"   handed out exactly once; {busy} pullers busy, "
            f"{min(map(len, got)):,}-{max(map(len, got)):,} each",
            f"{len(set(ids)):,} of {assigned:,}",
            "",
            "",
            verdict(len(ids) == assigned == len(set(ids)) and busy == pullers),
        )
