"""``bench/e2e.py``: the partial lookup cache rows (does a cache pay for itself?).

Three key distributions over the same events (the bench's files, user ids rewritten; the
unknown ids, one event in 500, and the malformed lines are kept as they are):

- **uniform** (the bench's files): 1M events over 1M users. A cache of ``--cached-rows``
  (120,000) per task hits ~10 % of the keys: the "cache must not cost more than it saves"
  row (target >= 0.95x the uncached rate of the same files, the main Sluice L=0 row);
- **narrow**: the same events over ``--narrow-users`` (20,000) users (a random subset of the
  table: ``hot[id % 20,000]``); a
  cache of ``--narrow-cache-rows`` (19,000) per task hits ~90 % (target >= 1.5x the uncached
  run over these files);
- **skewed**: Zipf-like, user of popularity rank r with probability ~ 1 / r ** ``--zipf``
  (1.1) over the 1M users (a few hot users take most events); a cache of ``--cached-rows``,
  with its uncached run over the same files (informational).

Each row prints the measured hit rate of the run (cache hits / keys the cache was asked,
from the run's lookup metrics) next to its ratio, and the share of keys for which the
cache was bypassed because it did not pay (``PartialCache.min_hit_rate``).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import orjson
from _e2e_common import SEED, Context, Result, console
from _e2e_sluice import run_sluice
from _harness import verdict_line

TARGET_AT_10 = 0.95  # a cache at ~10 % hits over the uncached rate of the same files
TARGET_AT_90 = 1.5  # at ~90 % hits
_MARKER = "_remapped.json"


def remapped(
    source: Path, target: Path, spec: dict[str, object], user: Callable[[int], int]
) -> Path:
    """``source``'s files with each event's ``user_id`` replaced by ``user(user_id)``
    (written once; rewritten when ``spec`` changes)."""
    marker = target / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return target
    for path in sorted(source.glob("dt=*/*.jsonl")):
        out = target / path.parent.name / path.name
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for line in path.read_bytes().splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict) and isinstance(event.get("user_id"), int):
                event["user_id"] = user(event["user_id"])
                line = orjson.dumps(event)
            lines.append(line)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(b"\n".join(lines) + b"\n")
        os.replace(tmp, out)
    marker.write_text(json.dumps(spec))
    return target


def cache_landings(ctx: Context) -> tuple[Path, Path]:
    """(narrow, skewed) copies of the bench's files."""
    args, root = ctx.args, ctx.out_root
    users, narrow = args.users, args.narrow_users
    rng = random.Random(SEED)
    # The hot users are a random subset of the table, not its first ids (those would share a
    # few heap and index pages: cheaper for Postgres than users spread over the table).
    hot = rng.sample(range(1, users + 1), narrow)
    spec = {"source": str(ctx.landing), "narrow": narrow, "spread": SEED}
    with console.status(f"Cache rows: events over {narrow:,} users…"):
        narrow_landing = remapped(
            ctx.landing,
            root / f"narrow-{ctx.landing.name}-n{narrow}",
            spec,
            lambda uid: uid if uid > users else hot[(uid - 1) % narrow],
        )
    weights = itertools.accumulate(1.0 / rank**args.zipf for rank in range(1, users + 1))
    cumulative = list(weights)
    ranks = range(1, users + 1)
    # A fixed random permutation: the hot users are not the smallest ids.
    ids = list(ranks)
    rng.shuffle(ids)

    def skewed(uid: int) -> int:
        if uid > users:
            return uid
        return ids[rng.choices(ranks, cum_weights=cumulative)[0] - 1]

    spec = {"source": str(ctx.landing), "zipf": args.zipf, "seed": SEED}
    with console.status(f"Cache rows: Zipf {args.zipf:g} events over {users:,} users…"):
        skewed_landing = remapped(
            ctx.landing, root / f"zipf-{ctx.landing.name}-s{args.zipf:g}", spec, skewed
        )
    return narrow_landing, skewed_landing


def cache_plans(ctx: Context) -> list[tuple[str, Callable[[], Result]]]:
    """(label, run) of the cache rows, for the interleaved rounds (the uniform uncached
    baseline is the main Sluice L=0 row)."""
    args = ctx.args
    narrow, skewed = cache_landings(ctx)
    run = functools.partial(run_sluice, ctx, 0.0)
    rows = [
        ("uniform", None, args.cached_rows, "cache-uniform"),
        ("narrow", narrow, 0, "nocache-narrow"),
        ("narrow", narrow, args.narrow_cache_rows, "cache-narrow"),
        ("skewed", skewed, 0, "nocache-skewed"),
        ("skewed", skewed, args.cached_rows, "cache-skewed"),
    ]
    plans = []
    for name, landing, rows_, kind in rows:
        label = f"Sluice, {name} keys, " + (f"cache {rows_:,} rows" if rows_ else "no cache")
        plans.append(
            (
                label,
                functools.partial(run, landing, label, rows_, kind),
            )
        )
    return plans


def _cpu_ratio(cached: Result, uncached: Result) -> str:
    """The same comparison in CPU seconds (the run's processes and Postgres; medians of the
    rounds): the ratio the rates tend to when the run is CPU-bound and alone on the machine.
    On a shared machine a run's wall time is about its CPU over the cores the other tenants
    leave it (the rows' ``others``), so the rate ratio also carries the load's changes."""
    spent, baseline = cached.total_cpu_median, uncached.total_cpu_median
    if not spent or not baseline:
        return ""
    return (
        f"; CPU s (run + Postgres, median) {spent:.1f} vs {baseline:.1f} uncached: "
        f"{baseline / spent:.2f}x less"
    )


def cache_verdicts(results: list[Result]) -> list[str]:
    def find(kind: str) -> Result | None:
        return next((r for r in results if r.kind == kind and r.latency_ms == 0.0), None)

    lines = []
    for cached, baseline, target, what in (
        ("cache-uniform", "sluice", TARGET_AT_10, "uniform keys (~10 % hits)"),
        ("cache-narrow", "nocache-narrow", TARGET_AT_90, "narrow keys (~90 % hits)"),
        ("cache-skewed", "nocache-skewed", None, "skewed keys (Zipf)"),
    ):
        with_cache, without = find(cached), find(baseline)
        if with_cache is None or without is None:
            lines.append(verdict_line(None, f"cache, {what} (not measured)"))
            continue
        ratio = with_cache.rate / without.rate
        lines.append(
            verdict_line(
                None if target is None else ratio >= target,
                f"cache, {what}: {with_cache.rate:,.0f} events/s = {ratio:.2f}x the uncached "
                f"{without.rate:,.0f} over the same files; measured {with_cache.cache_note}"
                + ("" if target is None else f" (target >= {target:g}x)")
                + _cpu_ratio(with_cache, without),
            )
        )
    return lines
