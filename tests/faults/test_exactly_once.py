"""Exactly-once under faults: run the example pipelines while SIGKILLing Spark Python workers
and the Spark driver and crash-restarting Postgres at seeded random moments, recovering after
each (a new ``sluice run PIPELINE`` after every dead driver).

- ``clickstream`` (JSON Lines → lookup ``public.users`` → Parquet): 100k events, then batches
  of 50k, doubled whenever a run ended before its kill moment (a fast machine). The output
  must hold every well-formed input event exactly once with the right enrichment
  (EXACTLY_ONCE), or at least once (AT_LEAST_ONCE: duplicates are counted); then the
  reporter sensor (ephemeral Dagster instance) reports each completed day and generation
  exactly once, leaving none unreported.
- ``orders`` (CSV → lookups ``crm.customers`` and ``ref.fx_rates`` → Map → Filter → Postgres
  upsert): smaller batches (its sink is slower); ``analytics.orders_enriched`` must equal the
  landing CSVs joined in SQL with the reference tables, and its committed sink transactions
  must count every row, dropped row and dead letter exactly once (EXACTLY_ONCE); its
  completed days are reported exactly once too.

Runs go through the ``sluice`` CLI in subprocesses against a Postgres server of the test's
own (one database per run). The seed is printed; ``SLUICE_FAULTS_SEED=<n>`` replays a schedule
(moments are relative to the runs' progress, so a replay is close, not identical).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest
from fault_harness import (
    POISON_REASONS,
    Chaos,
    Driver,
    OwnPostgres,
    Verdict,
    expected_events,
    land_poison,
    log,
    quarantined_files,
    sluice,
    sluice_env,
    verify,
)
from fault_reporting import report_completions_once
from kill_cases import LEASE_SECONDS, SEED, chaos_session, own_postgres, run_settings
from orders_oracle import OrdersVerdict, landed_orders, verify_orders

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(1200)]

# -- clickstream ------------------------------------------------------------------------------
CLICKSTREAM = "clickstream"
EVENTS = 100_000
USERS = 50_000
#: 10 kill points: every kind at least three times (the order is shuffled by the seed).
PLAN = ["worker"] * 4 + ["driver"] * 3 + ["postgres"] * 3
#: The poison-file case: fewer kills (every kind; its first batch is the same 100k events).
POISON_PLAN = ["worker"] * 2 + ["driver"] + ["postgres"]
#: AT_LEAST_ONCE: every kind twice. Its guarantee (nothing lost) is the weaker one and its
#: runs are the slowest (replays): ten kills there took ~4 minutes of the suite's twenty.
AT_LEAST_ONCE_PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2
#: Top-up batches at most, and their size. Batched reading enriches a top-up in about a
#: second, so a kill moment often comes after a run's work: the stream needs enough batches
#: (each one more run) to spend every kill.
MAX_TOP_UPS = 24
TOP_UP_EVENTS = 50_000
#: A top-up doubles after a run that ended before its kill moment, up to this.
TOP_UP_EVENTS_MAX = 400_000

# -- orders -----------------------------------------------------------------------------------
ORDERS = "orders"
#: The first batch over 2 days, then batches of one day, doubled like the clickstream's up
#: to ORDERS_TOP_UP_MAX; 3 files a day. A run's fixed costs (Spark, worker start-up, the
#: final checkpoint) dwarf a small batch's work: 3k and 24k orders both took ~7.5 s, with
#: ~1-2 s from the first worker to the end — room for only the earliest kill moments.
ORDERS_FIRST = 6_000
ORDERS_TOP_UP = 3_000
ORDERS_TOP_UP_MAX = 192_000
ORDERS_FILES_PER_DAY = 3
#: 1000 customers per tenant (5 tenants).
ORDERS_CUSTOMERS = 5_000
#: 6 kill points, every kind twice (shuffled by the seed): with the clickstream's 10, 16 in
#: an EXACTLY_ONCE `make faults` (26 with AT_LEAST_ONCE) in about 5 minutes.
ORDERS_PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2
ORDERS_MAX_TOP_UPS = 10


@pytest.fixture(scope="module")
def postgres(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path]]:
    with own_postgres(request) as server_and_root:
        yield server_and_root


def _settings(work: Path, db_url: str, mode: str, modules: str) -> dict[str, str]:
    return {
        **run_settings(work, db_url, modules),
        "SLUICE_CHECKPOINTING_MODE": mode,
        "SLUICE_LOOKUP_TIMEOUT_SECONDS": "20",
    }


def _chaos_loop(
    server: OwnPostgres,
    work: Path,
    env: dict[str, str],
    db_url: str,
    pipeline: str,
    chaos: Chaos,
    top_up: Callable[[], bool],
    label: str,
) -> None:
    """Spend every kill of ``chaos`` on runs of ``pipeline``, then drain; prints the
    timeline and checks that every kind was delivered."""
    driver = Driver(chaos, env, work, server, db_url, pipeline, LEASE_SECONDS, top_up=top_up)
    with chaos_session(driver, label):
        driver.spend_budget()
        driver.drain()


def _fault_run(
    postgres: tuple[OwnPostgres, Path],
    mode: str,
    seed: int,
    *,
    plan: list[str] = PLAN,
    poison: bool = False,
) -> Verdict:
    """``poison``: every batch lands a truncated gzip, a corrupt Parquet footer and a CSV
    with a bad header among its good files; each must end quarantined with its reason."""
    server, root = postgres
    name = mode.lower() + ("_poison" if poison else "")
    work = root / name
    work.mkdir()
    db_url = server.create_database(f"faults_{name}")
    settings = {
        **_settings(work, db_url, mode, "examples.clickstream"),
        # ~60 byte-range splits of ~256 KiB over 12 files.
        "SLUICE_TARGET_SPLIT_BYTES": str(256 << 10),
        # Blocks of ~400 events: more of them in flight (and in checkpoints) at each kill.
        "SLUICE_READ_BLOCK_BYTES": str(64 << 10),
    }
    env = sluice_env(settings, work)
    # The clickstream example's source and sink folders.
    landing = work / "data" / "landing" / "events"
    output = work / "data" / "warehouse" / "enriched_events"
    sluice(env, work, "db", "upgrade")
    load_users(asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7)
    # The first batch: EVENTS events over 3 days. Should the kills not have been spent when
    # everything is committed, further batches land on the following days (the stream keeps
    # arriving) — on a fast machine 100k events take only a few seconds.
    batches: list[DemoSpec] = []
    chaos = Chaos(seed, list(plan))
    optional: dict[str, tuple[object, ...]] = {}

    def land_batch() -> bool:
        if len(batches) > MAX_TOP_UPS:
            return False
        first = not batches
        top_up = batches[-1].events if len(batches) > 1 else TOP_UP_EVENTS
        spec = DemoSpec(
            events=EVENTS if first else chaos.next_batch_size(top_up, TOP_UP_EVENTS_MAX),
            days=3 if first else 1,
            files_per_day=4,
            users=USERS,
            start_date=date(2026, 1, 1) + timedelta(days=len(batches) + 2 * (not first)),
            seed=7 + len(batches),
        )
        generate_events(landing, spec)
        if poison:
            folder = landing / f"dt={spec.start_date}"
            optional.update(land_poison(folder, str(len(batches)), USERS))
        batches.append(spec)
        log(
            f"landed {spec.events:,} events from {spec.start_date}; "
            + sluice(env, work, "discover", CLICKSTREAM).strip()
        )
        return True

    land_batch()
    _chaos_loop(server, work, env, db_url, CLICKSTREAM, chaos, land_batch, mode)
    expected = expected_events(landing)
    log(f"{len(batches)} batches, {sum(b.events for b in batches):,} events landed")
    assert len(chaos.kills) >= len(plan)

    verdict = verify(output, db_url, CLICKSTREAM, expected, optional)
    print(verdict.line(mode), flush=True)
    poisoned = {
        f"poison-{n}{suffix}": reason
        for n in range(len(batches) if poison else 0)
        for suffix, reason in POISON_REASONS.items()
    }
    quarantined = quarantined_files(db_url, CLICKSTREAM)
    log(f"quarantined: {quarantined}")
    assert quarantined == poisoned
    completed = verdict.splits.get("COMPLETED", -1)
    assert verdict.splits == {
        "COMPLETED": completed,
        **({"FAILED": len(poisoned)} if poison else {}),
    }
    assert verdict.missing == 0 and verdict.unexpected == 0
    assert verdict.wrong == 0
    assert verdict.dead_letters == verdict.malformed
    _assert_reported_once(env, CLICKSTREAM)
    return verdict


def _assert_reported_once(env: dict[str, str], source: str) -> None:
    """Every completed day (and generation) is reported to Dagster exactly once, none is left
    unreported, and every day with output is complete once the stream drained."""
    reporting = report_completions_once(env, source)
    log(reporting.line())
    assert reporting.completed
    assert dict(reporting.materialized) == dict.fromkeys(reporting.completed, 1)
    assert reporting.unreported == 0 and reporting.reported_again == 0
    assert reporting.open_days == []


# `extended` since the stream sources' tests joined `make test` (CI's 30-minute budget): the
# kills of workers, the driver and Postgres run in `make faults`, with the CDC and Kafka cases.
@pytest.mark.extended
def test_exactly_once_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    verdict = _fault_run(postgres, "EXACTLY_ONCE", SEED)
    assert verdict.duplicates == 0


# `extended` (about 2.5 minutes; CI's time budget): poison files are quarantined in a
# continuous run in tests/integration/test_poison_splits.py and under changing files in
# tests/faults/test_errors_files.py; the kills by test_exactly_once_under_kills (make faults).
@pytest.mark.extended
def test_poison_files_are_quarantined_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    """Poison files among good ones while workers, the driver and Postgres are killed: each is
    quarantined with its reason, the rest is exactly once."""
    verdict = _fault_run(postgres, "EXACTLY_ONCE", SEED + 3, plan=POISON_PLAN, poison=True)
    assert verdict.duplicates == 0


# `extended`: make faults runs it, make test leaves it out (CI's time budget).
@pytest.mark.extended
def test_at_least_once_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    # Replays after a kill may duplicate (counted and printed); nothing may be lost.
    _fault_run(postgres, "AT_LEAST_ONCE", SEED + 1, plan=AT_LEAST_ONCE_PLAN)


def _orders_fault_run(postgres: tuple[OwnPostgres, Path], mode: str, seed: int) -> OrdersVerdict:
    server, root = postgres
    work = root / f"orders_{mode.lower()}"
    work.mkdir()
    db_url = server.create_database(f"faults_orders_{mode.lower()}")
    settings = {
        **_settings(work, db_url, mode, "examples.orders"),
        # A file of 1000 orders is ~75 KB: byte-range splits of 32 KiB, 3 per file.
        "SLUICE_TARGET_SPLIT_BYTES": str(32 << 10),
        # Blocks of ~100 orders: several in flight (and in checkpoints) at each kill.
        "SLUICE_READ_BLOCK_BYTES": str(8 << 10),
    }
    env = sluice_env(settings, work)
    landing = work / "data" / "landing" / ORDERS
    sluice(env, work, "db", "upgrade")
    batches: list[int] = []
    chaos = Chaos(seed, list(ORDERS_PLAN))

    def land_batch() -> bool:
        """One more batch through the example's own generator (`sluice demo-data orders`,
        which also creates and fills crm.customers and ref.fx_rates the first time)."""
        if len(batches) > ORDERS_MAX_TOP_UPS:
            return False
        first = not batches
        days = 2 if first else 1
        start = date(2026, 1, 1) + timedelta(days=len(batches) + (not first))
        top_up = batches[-1] if len(batches) > 1 else ORDERS_TOP_UP
        count = ORDERS_FIRST if first else chaos.next_batch_size(top_up, ORDERS_TOP_UP_MAX)
        demo = {
            "SLUICE_DEMO_EVENTS": str(count),
            "SLUICE_DEMO_DAYS": str(days),
            "SLUICE_DEMO_FILES_PER_DAY": str(ORDERS_FILES_PER_DAY),
            "SLUICE_DEMO_USERS": str(ORDERS_CUSTOMERS),
            "SLUICE_DEMO_START_DATE": start.isoformat(),
            "SLUICE_DEMO_SEED": str(11 + len(batches)),
        }
        said = sluice({**env, **demo}, work, "demo-data", ORDERS).strip().splitlines()[-1]
        batches.append(count)
        log(f"{said}; " + sluice(env, work, "discover", ORDERS).strip())
        return True

    land_batch()
    _chaos_loop(server, work, env, db_url, ORDERS, chaos, land_batch, f"orders {mode}")
    landed = landed_orders(landing)
    log(
        f"{len(batches)} batches, {sum(batches):,} orders landed in {landed.files} files "
        f"({landed.malformed} malformed)"
    )
    assert len(chaos.kills) == len(ORDERS_PLAN)

    verdict = verify_orders(db_url, ORDERS, landed)
    print(verdict.line(mode), flush=True)
    assert verdict.splits == {"COMPLETED": verdict.splits.get("COMPLETED", -1)}
    assert verdict.missing == 0 and verdict.unexpected == 0
    assert verdict.wrong == 0
    assert verdict.dead_letters == verdict.expected_dead_letters
    # No staged row is left behind: every one was moved by its commit or removed by recovery.
    assert verdict.staged_left == 0
    _assert_reported_once(env, ORDERS)
    return verdict


# `extended` (CI's 30-minute budget: `make faults` runs it, `make test` leaves it out).
@pytest.mark.extended
def test_orders_exactly_once_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    verdict = _orders_fault_run(postgres, "EXACTLY_ONCE", SEED + 2)
    # Every row, dropped row and dead letter was committed exactly once.
    assert verdict.duplicates == 0
    assert verdict.committed_rows == verdict.expected_rows == verdict.rows
    assert verdict.dropped == verdict.expected_dropped
    assert verdict.committed_dead_letters == verdict.expected_dead_letters
