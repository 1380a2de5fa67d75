"""``PostgresCdcSource`` definitions: the CDC fields it adds, the upsert it makes (greatest
``_lsn`` wins, ``_op = 'd'`` deletes), and each bad definition as one line."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from spark_jobs import (
    Map,
    ParquetSink,
    Pipeline,
    PipelineDefinitionError,
    PostgresCdcSource,
    PostgresSink,
)

SCHEMA = {"id": "int64", "v": "string"}


def _pipeline(sink: Any = None, steps: Any = (), **source: Any) -> Pipeline:
    options: dict[str, Any] = {"tables": "shop.orders", "key": "id", "schema": SCHEMA, **source}
    return Pipeline(
        name="orders_cdc",
        source=PostgresCdcSource(**options),
        steps=list(steps),
        sink=sink if sink is not None else PostgresSink("shop.copy", upsert_key=["id"]),
    )


def test_records_carry_the_declared_and_the_cdc_fields() -> None:
    plan = _pipeline().plan
    names = [c.name for c in plan.source.columns]
    assert names == ["id", "v", "_op", "_lsn", "_commit_time", "_before", "_table"]
    assert plan.source.event_time == "_commit_time" and not plan.source.partitioned
    options = plan.source.options
    assert (options.slot, options.publication) == ("sluice_orders_cdc", "sluice_orders_cdc")
    assert options.tables == (("shop", "orders"),) and options.declared == ("id", "v")


def test_an_upsert_sink_keeps_the_latest_lsn_and_applies_deletes() -> None:
    sink = _pipeline().plan.sink
    assert (sink.latest_by, sink.op_field) == ("_lsn", "_op")
    append = _pipeline(sink=ParquetSink("copy")).plan.sink
    assert (append.latest_by, append.op_field) == (None, None)


def _drop_op(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.drop_columns(["_op"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "other"}, "key 'other' must be a declared field"),
        ({"key": "v"}, "key 'v' is declared 'string': the key must be an integer"),
        ({"tables": []}, "tables must name at least one table"),
        ({"tables": ["a.b", "a.b"]}, "tables names a table twice"),
        ({"tables": ["Bad-Name"]}, "is not a valid identifier"),
        ({"rows_per_chunk": 0}, "rows_per_chunk must be a positive integer"),
        ({"slot": "Slot!"}, "slot 'Slot!' is not a valid identifier"),
        ({"schema": {**SCHEMA, "_op": "string"}}, "field '_op' is added by the source"),
    ],
)
def test_bad_definitions_are_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=message) as err:
        _pipeline(**change)
    assert "\n" not in str(err.value) and "orders_cdc" in str(err.value)


def test_an_upsert_without_the_change_fields_is_refused() -> None:
    with pytest.raises(PipelineDefinitionError, match="needs the source's field\\(s\\) _op"):
        _pipeline(steps=[Map(_drop_op)])


def test_an_upsert_keyed_without_the_source_key_is_refused() -> None:
    """A delete carries only the source's key columns: an upsert on other fields would never
    apply it. Refused in one line naming the sink; a key that includes the source's key (a
    multi-table sink on ``_table`` and the key) and a key a step renamed are allowed."""
    with pytest.raises(PipelineDefinitionError, match="must include the source's key") as err:
        _pipeline(sink=PostgresSink("shop.copy", upsert_key=["v"]))
    line = str(err.value)
    assert "\n" not in line and "orders_cdc" in line and "sink" in line
    assert "upsert_key (v)" in line and "key (id)" in line and "deletes" in line
    both = _pipeline(sink=PostgresSink("shop.copy", upsert_key=["_table", "id"])).plan.sink
    assert both.op_field == "_op"

    def renamed(batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.rename_columns(["order_id" if n == "id" else n for n in batch.schema.names])

    step = Map(renamed)
    sink = PostgresSink("shop.copy", upsert_key=["order_id"])
    assert _pipeline(sink=sink, steps=[step]).plan.sink.upsert_key == ("order_id",)


async def _enrich(record: dict[str, Any]) -> dict[str, Any]:
    return {"extra": 1}


def test_an_append_of_a_change_stream_after_a_per_record_async_step_is_refused() -> None:
    """A transaction's changes share one stream position: a restore re-reads a per-record
    step's in-flight records by position, so an append sink would get some of them twice.
    Per batch (whole transactions per block) and upsert sinks are exact, and allowed."""
    from spark_jobs import AsyncMap

    per_record = AsyncMap(_enrich, output={"extra": "int64"})
    with pytest.raises(PipelineDefinitionError, match='per="batch"') as err:
        _pipeline(sink=ParquetSink("copy"), steps=[per_record])
    assert "\n" not in str(err.value) and "step 1" in str(err.value)
    assert _pipeline(steps=[per_record]).plan.sink.op_field == "_op"


@pytest.mark.parametrize("on_miss", ["drop", "dead_letter"])
def test_a_lookup_that_does_not_keep_its_misses_is_refused(on_miss: str) -> None:
    """A delete carries only the key (its other columns are null): a Lookup on them misses,
    and a miss dropped or dead-lettered (one transaction's dead letters share its position)
    would lose the delete. Refused at definition, in one line naming the step."""
    from spark_jobs import Lookup

    def lookup(miss: str) -> Lookup:
        return Lookup("shop.users", on={"v": "name"}, columns=["country"], on_miss=miss)  # type: ignore[arg-type]

    with pytest.raises(PipelineDefinitionError, match='on_miss="keep"') as err:
        _pipeline(steps=[lookup(on_miss)])
    line = str(err.value)
    assert "\n" not in line and "step 1 (Lookup" in line and on_miss in line
    assert "delete" in line
    with pytest.raises(PipelineDefinitionError, match="loses deletes"):
        _pipeline(sink=ParquetSink("copy"), steps=[lookup(on_miss)])
    assert _pipeline(steps=[lookup("keep")]).plan.stages[0].on_miss == "keep"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kind", "setting", "bad"),
    [
        ("Lookup", "mode", {"mode": "unordered"}),
        ("Lookup", "key", {"mode": "key", "key": "v"}),
        ("AsyncMap", "mode", {"mode": "unordered"}),
        ("AsyncMap", "key", {"mode": "key", "key": ["v"]}),
    ],
)
def test_a_step_that_can_reorder_a_rows_changes_is_refused(
    kind: str, setting: str, bad: dict[str, Any]
) -> None:
    """The changes of one transaction share their `_lsn`: the upsert keeps the last staged,
    so a step that reorders a row's changes (unordered, or keyed by fields other than the
    row's key) can leave an older version of the row. Refused at definition, in one line
    naming the step and the setting; ordered, and keyed by fields including the key, pass."""
    from spark_jobs import AsyncMap, Lookup

    def step(**mode: Any) -> Any:
        if kind == "Lookup":
            return Lookup("shop.users", on={"v": "name"}, columns=["country"], **mode)
        return AsyncMap(_enrich, output={"extra": "int64"}, per="batch", **mode)

    with pytest.raises(PipelineDefinitionError, match="reorder a row's changes") as err:
        _pipeline(steps=[step(**bad)])
    line = str(err.value)
    assert "\n" not in line and f"step 1 ({kind}" in line and "orders_cdc" in line
    assert f"{setting}=" in line and "(id)" in line
    for fine in ({}, {"mode": "ordered"}, {"mode": "key", "key": ["id"]}):
        assert _pipeline(steps=[step(**fine)]).plan.stages[0].mode in ("ordered", "key")  # type: ignore[attr-defined]
    both = _pipeline(steps=[step(mode="key", key=["v", "id"])]).plan.stages[0]
    assert both.key == ("v", "id")  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["", "SHOP DB", "1SHOP", "shop-db", 42])
def test_url_env_must_name_an_environment_variable(name: Any) -> None:
    with pytest.raises(PipelineDefinitionError, match="url_env must be the name of an env"):
        _pipeline(url_env=name)


def test_url_env_names_a_variable_not_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from enumerator_service import ConfigError, ServerUnreachable
    from spark_jobs.connectors.postgres_cdc._source_db import source_engine, task_dsn

    assert _pipeline(url_env="SHOP_DB").plan.source.options.url_env == "SHOP_DB"
    monkeypatch.delenv("SHOP_DB", raising=False)
    with pytest.raises(ConfigError, match=r"^PostgresCdcSource\(url_env\): environment variable"):
        task_dsn("SHOP_DB", "postgresql:///platform")
    assert task_dsn(None, "postgresql:///platform") == "postgresql:///platform"
    # Unreachable (nothing listens on port 1): the setting, the variable, no password.
    monkeypatch.setenv("SHOP_DB", "postgresql://cdc:s3cret-pw@127.0.0.1:1/shop")
    with pytest.raises(ConfigError) as caught:
        source_engine("SHOP_DB", None)  # type: ignore[arg-type]
    line = str(caught.value)
    assert isinstance(caught.value, ServerUnreachable)  # an outage: exit 1, not 2
    assert line.startswith("PostgresCdcSource(url_env): SHOP_DB: cannot connect to")
    assert "s3cret-pw" not in line and "\n" not in line
    assert task_dsn("SHOP_DB", "x") == "postgresql://cdc:s3cret-pw@127.0.0.1:1/shop"
    monkeypatch.setenv("SHOP_DB", "mysql://cdc@db/shop")
    with pytest.raises(ConfigError, match="does not hold a postgresql:// URL"):
        task_dsn("SHOP_DB", "x")


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ('connection failed: ... failed: FATAL:  database "x" does not exist', True),
        ('connection failed: ... failed: FATAL:  role "x" does not exist', True),
        ('connection failed: ... FATAL:  password authentication failed for user "u"', True),
        ("connection failed: ... FATAL:  the database system is starting up", False),
        ("connection failed: ... FATAL:  sorry, too many clients already", False),
        ('connection failed: connection to server at "127.0.0.1", port 1 failed: refused', False),
    ],
)
def test_a_server_that_refuses_the_user_is_a_setting_one_that_does_not_answer_an_outage(
    message: str, refused: bool
) -> None:
    from enumerator_service import refused_by_server

    assert refused_by_server(message) is refused


class _Clock:
    """A virtual clock for ``_source_db``: ``sleep`` moves it on, nothing waits."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def test_a_reader_waits_out_a_restart_but_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from enumerator_service import ConfigError, ServerUnreachable
    from spark_jobs.connectors.postgres_cdc import _source_db

    clock = _Clock()
    monkeypatch.setattr(_source_db, "time", clock)
    url = "postgresql://cdc:s3cret-pw@db.example:5432/shop"
    down = 'connection failed: connection to server at "10.0.0.9", port 5432 failed: refused'
    attempts: list[float] = []

    def back_after(seconds: float) -> object:
        attempts.append(clock.now)
        if clock.now < seconds:
            raise psycopg.OperationalError(down)
        return "connected"

    where = _source_db.where_of("SHOP_DB")
    assert _source_db.connect_patiently(lambda: back_after(5.0), url, where) == "connected"
    assert 5.0 <= clock.now < 7.0 and len(attempts) > 3  # backing off, at most 2 s apart
    # Still down after the patience: an outage, naming setting and variable, no password.
    clock.now = 0.0
    with pytest.raises(ServerUnreachable) as caught:
        _source_db.connect_patiently(lambda: back_after(1e9), url, where)
    assert 28.0 <= clock.now <= 30.0
    line = str(caught.value)
    assert line.startswith("PostgresCdcSource(url_env): SHOP_DB: cannot connect to postgresql")
    assert "s3cret-pw" not in line
    # Refused (a wrong password): at once, a configuration error.
    clock.now, clock.slept = 0.0, 0.0

    def refused() -> object:
        raise psycopg.OperationalError(
            '... failed: FATAL:  password authentication failed for "cdc"'
        )

    with pytest.raises(ConfigError) as refusal:
        _source_db.connect_patiently(refused, url, where)
    assert not isinstance(refusal.value, ServerUnreachable) and clock.slept == 0.0
