"""``bench/e2e.py``: the small-run rows (issue 15: small runs are not dominated by fixed costs).

Two Sluice clickstream runs at L = 0 on the session already up, each the median of
``--rounds`` interleaved rounds after one unmeasured run of each:

- **200k events** (a fifth of ``--events``, so with ``--quick`` a fifth of its 100k: the
  ratio is the target's, on proportionally smaller runs) in a fifth of the files, whose rate
  is compared with the main Sluice L = 0 row of the same invocation (target >= 0.5x);
- **one small file** of 1,000 events, whose wall time (discover + run, the session up)
  is compared with 3 s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from _e2e_common import Context, Result
from _e2e_data import prepare_events
from _e2e_sluice import run_sluice
from _harness import verdict_line

from enumerator_service import Settings

SMALL_SHARE = 5  # the 200k run is 1/5 of the 1M run (and of --quick's 100k)
ONE_FILE_EVENTS = 1_000
TARGET_SMALL_RATE = 0.5  # the 200k run's rate over the 1M run's, at least
TARGET_ONE_FILE_SECONDS = 3.0


def small_plans(ctx: Context, settings: Settings) -> list[tuple[str, Callable[[], Result]]]:
    """(label, run) of the two small runs; their data is generated (cached) here."""
    args = ctx.args
    events = max(1, args.events // SMALL_SHARE)
    files = max(1, args.files // SMALL_SHARE)
    small: Path = prepare_events(settings, events, files, args.users)
    one: Path = prepare_events(settings, ONE_FILE_EVENTS, 1, args.users)
    return [
        (
            f"small: Sluice, {events:,} events (1/{SMALL_SHARE} run), L=0 ms",
            lambda: run_sluice(
                ctx, 0.0, small, f"Sluice, {events:,} events in {files} files", kind="small"
            ),
        ),
        (
            f"small: Sluice, one file of {ONE_FILE_EVENTS:,} events, L=0 ms",
            lambda: run_sluice(
                ctx, 0.0, one, f"Sluice, one file of {ONE_FILE_EVENTS:,} events", kind="one-file"
            ),
        ),
    ]


def small_verdicts(results: list[Result], quick: bool) -> list[str]:
    def find(kind: str) -> Result | None:
        return next((r for r in results if r.kind == kind and r.latency_ms == 0.0), None)

    lines = []
    full, small, one = find("sluice"), find("small"), find("one-file")
    scaled = " (--quick: both runs scaled down 10x, same ratio)" if quick else ""
    if full and small:
        ratio = small.rate / full.rate
        lines.append(
            verdict_line(
                ratio >= TARGET_SMALL_RATE,
                f"small run: {small.events:,} events at {small.rate:,.0f}/s = {ratio:.2f}x the "
                f"{full.events:,}-event run's {full.rate:,.0f}/s (target >= "
                f"{TARGET_SMALL_RATE:g}x; medians of this invocation){scaled}",
            )
        )
    else:
        lines.append(verdict_line(None, "small run vs the full run's rate (not measured)"))
    if one:
        lines.append(
            verdict_line(
                one.seconds <= TARGET_ONE_FILE_SECONDS,
                f"one small file: {one.events:,} events in {one.seconds:.2f} s, session up "
                f"(target <= {TARGET_ONE_FILE_SECONDS:g} s; median)",
            )
        )
    else:
        lines.append(verdict_line(None, "one small file's wall time (not measured)"))
    return lines
