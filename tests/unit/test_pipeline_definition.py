"""The pipeline definition API: validation at definition time, one error per mistake naming
pipeline, part and field, and the derived output schema."""

from __future__ import annotations

import dataclasses
import types
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from enumerator_service import ConfigError, Settings
from spark_jobs import (
    AsyncMap,
    CoroutineAsyncFunction,
    FileSource,
    Filter,
    FullCache,
    Lookup,
    Map,
    ParquetSink,
    PartialCache,
    Pipeline,
    PipelineDefinitionError,
    PostgresSink,
    RetryOnMiss,
    TableSource,
    fixed_delay,
)
from spark_jobs.pipeline._describe import describe
from spark_jobs.pipeline._registry import load_pipelines, pick_pipeline

SCHEMA = {
    "order_id": "string",
    "tenant_id": "int64",
    "customer_id": "int64",
    "currency": "string",
    "amount": "decimal(12,2)",
    "ordered_at": "timestamp",
}


def add_eur(batch: pa.RecordBatch) -> pa.RecordBatch:
    product = pc.multiply(batch.column("amount"), batch.column("rate_to_eur"))
    return batch.append_column("amount_eur", product.cast(pa.decimal128(18, 2)))


def orders(**overrides: Any) -> Pipeline:
    fields: dict[str, Any] = {
        "name": "orders",
        "source": FileSource(
            schema=SCHEMA, required=["order_id", "ordered_at"], event_time="ordered_at"
        ),
        "steps": [
            Lookup(
                "crm.customers",
                on={"tenant_id": "tenant_id", "customer_id": "id"},
                columns={"name": "customer_name", "segment": "segment"},
            ),
            Lookup(
                "ref.fx_rates",
                on={"currency": "code"},
                columns=["rate_to_eur"],
                on_miss="dead_letter",
                cache=FullCache(reload_every="10m"),
            ),
            Map(add_eur, output={"amount_eur": "decimal(18,2)"}),
            Filter(pc.field("amount_eur") > 0),
        ],
        "sink": PostgresSink("analytics.orders_enriched", upsert_key=["order_id"]),
    }
    fields.update(overrides)
    return Pipeline(**fields)


class Score(CoroutineAsyncFunction[dict[str, Any], dict[str, Any]]):
    async def invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"score": 1.0}]


def test_the_output_schema_is_derived_step_by_step() -> None:
    pipeline = orders()
    names = [c.name for c in pipeline.output]
    assert names == [*SCHEMA, "customer_name", "segment", "rate_to_eur", "amount_eur"]
    kinds = {c.name: c.type for c in pipeline.output}
    assert kinds["amount"] == pa.decimal128(12, 2)
    assert kinds["ordered_at"] == pa.timestamp("us", tz="UTC")
    # Looked-up types come from the catalog when a run opens; declared ones are known now.
    assert kinds["customer_name"] is None and kinds["rate_to_eur"] is None
    assert kinds["amount_eur"] == pa.decimal128(18, 2)
    plan = pipeline.plan
    assert plan.key == ("order_id",)  # from the upsert key
    assert not plan.complete
    lookup = plan.lookups()[0]
    assert lookup.keys == (("tenant_id", "tenant_id"), ("customer_id", "id"))
    assert lookup.columns == (("name", "customer_name"), ("segment", "segment"))
    second = plan.lookups()[1]
    assert (second.on_miss, second.cache, second.reload_every) == ("dead_letter", "full", 600.0)


def test_a_probed_map_without_lookups_is_complete() -> None:
    pipeline = Pipeline(
        name="plain",
        source=FileSource(schema={"a": "int64", "b": "float64"}),
        steps=[
            Map(lambda batch: batch.append_column("c", pc.add(batch.column("a"), 1))),
            Filter(pc.field("c") > 2),
        ],
    )
    assert pipeline.plan.complete
    assert pipeline.plan.output_schema() == pa.schema(
        [("a", pa.int64()), ("b", pa.float64()), ("c", pa.int64())]
    )


def test_describe_lists_source_steps_sink_and_output() -> None:
    described = describe(orders())
    assert described.source.startswith("files in <data>/landing/orders (dt=YYYY-MM-DD folders)")
    assert described.steps[0].startswith("1. Lookup crm.customers on tenant_id=tenant_id")
    assert "full cache reloaded every 600s" in described.steps[1]
    assert described.steps[3] == "4. Filter (amount_eur > 0)"
    assert described.sink == "postgres analytics.orders_enriched, upsert on order_id; key order_id"
    assert described.output[-1] == ("amount_eur", "decimal(18,2)", "step 3 (Map add_eur)")


def test_key_mode_names_its_key_fields_in_the_plan_and_description() -> None:
    pipeline = orders(
        steps=[
            Lookup(
                "ref.fx_rates",
                on={"currency": "code"},
                columns=["rate_to_eur"],
                mode="key",
                key=("tenant_id", "order_id"),
            ),
            AsyncMap(Score(), output={"score": "float64"}, mode="key", key="order_id"),
        ]
    )
    lookup, score = pipeline.plan.stages
    assert (lookup.mode, lookup.key) == ("key", ("tenant_id", "order_id"))  # type: ignore[attr-defined]
    assert (score.mode, score.key) == ("key", ("order_id",))  # type: ignore[attr-defined]
    described = describe(pipeline)
    assert described.steps[0].endswith("ordered per key tenant_id, order_id)")
    assert described.steps[1].endswith("ordered per key order_id)")


def _error(build: Any) -> str:
    with pytest.raises(PipelineDefinitionError) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        pytest.param(
            lambda: orders(steps=[Lookup("crm.customers", on={"tenant": "id"}, columns=["name"])]),
            "pipeline orders: step 1 (Lookup crm.customers): on: key field 'tenant' is not in the "
            "input (fields: order_id, tenant_id, customer_id, currency, amount, ordered_at)",
            id="unknown key field",
        ),
        pytest.param(
            lambda: orders(steps=[Filter(pc.field("amount_eur") > 0)]),
            "pipeline orders: step 1 (Filter (amount_eur > 0)): the predicate does not apply to "
            "the input: No match for FieldRef.Name(amount_eur)",
            id="unknown filter field",
        ),
        pytest.param(
            lambda: orders(source=FileSource(schema={**SCHEMA, "amount": "decimal"})),
            "pipeline orders: source: field amount: unknown type 'decimal'",
            id="unknown type",
        ),
        pytest.param(
            lambda: orders(
                steps=[Lookup("crm.customers", on={"tenant_id": "id"}, columns=["currency"])]
            ),
            "pipeline orders: step 1 (Lookup crm.customers): field 'currency' is produced twice "
            "(also by source)",
            id="two steps producing one column",
        ),
        pytest.param(
            lambda: orders(
                steps=[
                    Lookup(
                        "crm.customers",
                        on={"tenant_id": "id"},
                        columns=["name"],
                        url_env="postgresql://u:secret@crm/db",
                    )
                ]
            ),
            "pipeline orders: step 1 (Lookup crm.customers): url_env must be the name of the "
            "environment variable that holds the URL, not the URL itself",
            id="a URL given as url_env (not repeated: it may hold a password)",
        ),
        pytest.param(
            lambda: orders(
                steps=[
                    Lookup("crm.customers", on={"tenant_id": "id"}, columns=["name"], url_env="1x")
                ]
            ),
            "pipeline orders: step 1 (Lookup crm.customers): url_env must be the name of an "
            "environment variable (letters, digits and _), not '1x'",
            id="url_env not a variable name",
        ),
        pytest.param(
            lambda: orders(
                steps=[
                    AsyncMap(Score(), output={"score": "float64"}),
                    AsyncMap(Score(), output={"score": "float64"}, name="again"),
                ]
            ),
            "pipeline orders: step 2 (AsyncMap again): field 'score' is produced twice (also by "
            "step 1 (AsyncMap Score))",
            id="two async steps producing one column",
        ),
        pytest.param(
            lambda: orders(steps=[Map(lambda b: b.append_column("x", pc.negate(b["currency"])))]),
            "pipeline orders: step 1 (Map <lambda>): calling it on an empty batch of its input "
            "failed (ArrowNotImplementedError",
            id="a type a step cannot take",
        ),
        pytest.param(
            lambda: orders(source=FileSource(schema=SCHEMA, event_time="amount")),
            "pipeline orders: source: event_time: field 'amount' must be a timestamp",
            id="event time not a timestamp",
        ),
        pytest.param(
            lambda: orders(source=FileSource(schema=SCHEMA, required=["nope"])),
            "pipeline orders: source: required field 'nope' is not in the input",
            id="unknown required field",
        ),
        pytest.param(
            lambda: orders(sink=PostgresSink("analytics.x", upsert_key=["id"])),
            "pipeline orders: sink: upsert_key field 'id' is not in the input",
            id="unknown upsert key",
        ),
        pytest.param(
            lambda: orders(sink=ParquetSink("Bad-Name")),
            "pipeline orders: sink: table 'Bad-Name' is not a valid identifier",
            id="bad table name",
        ),
        pytest.param(
            lambda: orders(sink=PostgresSink("analytics." + "t" * 64)),
            f"pipeline orders: sink: table '{'t' * 64}' is not a valid identifier",
            id="sink table name beyond 63 characters",
        ),
        pytest.param(
            lambda: orders(name="Orders!"),
            "pipeline Orders!: pipeline name 'Orders!' is not a valid identifier",
            id="bad pipeline name",
        ),
        pytest.param(
            lambda: orders(
                steps=[
                    Lookup(
                        "ref.fx_rates",
                        on={"currency": "code"},
                        columns=["rate"],
                        on_miss=RetryOnMiss(attempts=3, delay="2s"),
                        timeout="5s",
                    )
                ]
            ),
            "pipeline orders: step 1 (Lookup ref.fx_rates): timeout 5s must exceed the 3 retries "
            "of 2s on a miss",
            id="retry longer than the timeout",
        ),
        pytest.param(
            lambda: orders(
                steps=[
                    AsyncMap(
                        Score(),
                        output={"s": "float64"},
                        retry=fixed_delay(2, 0.1, on_exception=lambda _error: True),
                    )
                ]
            ),
            "pipeline orders: step 1 (AsyncMap Score): a retry strategy needs a timeout",
            id="retry without timeout",
        ),
        pytest.param(
            lambda: orders(steps=[AsyncMap(lambda row: row, output={"s": "float64"})]),
            "pipeline orders: step 1 (AsyncMap <lambda>): function must be an AsyncFunction",
            id="not an async function",
        ),
        pytest.param(
            lambda: orders(source=FileSource(schema={"dt": "date"}), steps=[], sink=ParquetSink()),
            "pipeline orders: sink: field 'dt' collides with the partition column",
            id="partition column collision",
        ),
        pytest.param(
            lambda: orders(key=["nope"]),
            "pipeline orders: key: key field 'nope' is not in the input",
            id="unknown key",
        ),
        pytest.param(
            lambda: orders(
                steps=[Lookup("t", on="order_id", columns=["x"], cache=PartialCache(0))]
            ),
            "pipeline orders: step 1 (Lookup t): cache: PartialCache.max_rows must be >= 1",
            id="empty cache",
        ),
        pytest.param(
            lambda: orders(source=FileSource(schema=SCHEMA, late_records="drop")),  # type: ignore[arg-type]
            "pipeline orders: source: late_records must be 'dead_letter' or 'reopen', got 'drop'",
            id="unknown late-record policy",
        ),
        pytest.param(
            lambda: orders(
                steps=[Lookup("ref.fx_rates", on="currency", columns=["r"], mode="key")]
            ),
            "pipeline orders: step 1 (Lookup ref.fx_rates): mode='key' needs key=",
            id="key mode without key",
        ),
        pytest.param(
            lambda: orders(steps=[AsyncMap(Score(), output={"s": "float64"}, key="order_id")]),
            "pipeline orders: step 1 (AsyncMap Score): key 'order_id' is only for mode='key' "
            "(mode is 'ordered')",
            id="key without key mode",
        ),
        pytest.param(
            lambda: orders(
                steps=[Lookup("ref.fx_rates", on="currency", columns=["r"], mode="key", key="id")]
            ),
            "pipeline orders: step 1 (Lookup ref.fx_rates): key field 'id' is not in the input",
            id="unknown key-mode field",
        ),
        pytest.param(
            lambda: orders(
                steps=[AsyncMap(Score(), output={"s": "float64"}, mode="by key")]  # type: ignore[arg-type]
            ),
            "pipeline orders: step 1 (AsyncMap Score): mode must be 'ordered', 'unordered' or "
            "'key', got 'by key'",
            id="unknown mode",
        ),
        pytest.param(
            lambda: orders(source=TableSource("public.orders", key="id", schema={})),
            "pipeline orders: source: schema must map at least one field name to its type",
            id="table source without schema",
        ),
    ],
)
def test_each_definition_mistake_is_one_line_naming_pipeline_step_and_field(
    build: Any, expected: str
) -> None:
    assert _error(build).startswith(expected)


def test_replacing_a_definition_validates_it_again() -> None:
    pipeline = orders()
    renamed = dataclasses.replace(pipeline, name="orders_copy")
    assert renamed.plan.name == "orders_copy"
    with pytest.raises(PipelineDefinitionError):
        dataclasses.replace(pipeline, key=["missing"])


def test_durations_and_start_dates_are_normalised() -> None:
    pipeline = Pipeline(
        name="timed",
        source=FileSource(
            schema={"t": "timestamp"},
            event_time="t",
            start_date="2026-03-01",
            out_of_orderness="500ms",
            idle_timeout="2m",
        ),
        steps=[Lookup("x", on="t", columns=["y"], timeout=7, cache=PartialCache(10, "1h"))],
    )
    source = pipeline.plan.source
    assert (source.start_date, source.out_of_orderness, source.idle_timeout) == (
        date(2026, 3, 1),
        0.5,
        120.0,
    )
    assert (source.late_records, source.event_day_partitions) == ("reopen", True)
    strict = dataclasses.replace(
        pipeline, source=dataclasses.replace(pipeline.source, late_records="dead_letter")
    )
    assert strict.plan.source.late_records == "dead_letter"
    assert "late records: dead_letter" in describe(strict).source
    lookup = pipeline.plan.lookups()[0]
    assert (lookup.timeout, lookup.cache_rows, lookup.expire_after_write) == (7.0, 10, 3600.0)


def test_the_registry_finds_every_pipeline_of_the_named_modules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("user_pipelines_for_test")
    module.first = orders(name="first")  # type: ignore[attr-defined]
    module.second = orders(name="second")  # type: ignore[attr-defined]
    module.alias = module.first  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "user_pipelines_for_test", module)
    settings = Settings(pipelines="user_pipelines_for_test")
    found = load_pipelines(settings)
    assert list(found) == ["first", "second"]
    assert pick_pipeline(found, "second").name == "second"
    with pytest.raises(ConfigError, match="name one of the pipelines: first, second"):
        pick_pipeline(found, None)
    with pytest.raises(ConfigError, match="no pipeline 'third'"):
        pick_pipeline(found, "third")


def test_registry_errors_name_the_setting() -> None:
    with pytest.raises(ConfigError, match="SLUICE_PIPELINES: no module named 'no_such_module'"):
        load_pipelines(Settings(pipelines="no_such_module"))
    with pytest.raises(ConfigError, match="SLUICE_PIPELINES: no pipelines registered"):
        pick_pipeline(load_pipelines(Settings(pipelines="")), None)
    with pytest.raises(ConfigError, match="module json defines no Pipeline"):
        load_pipelines(Settings(pipelines="json"))


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            'FileSource(schmea={"a": "int64"})',
            r"FileSource.__init__\(\) got an unexpected keyword argument 'schmea';"
            r" did you mean 'schema'\?$",
        ),
        (
            'FileSource(schema={"a": "int64"}, frobnicate=1)',
            r".*unexpected keyword argument 'frobnicate'; it takes schema, required, .*",
        ),
        ("PostgresSink()", r"PostgresSink.__init__\(\) missing 1 required positional argument"),
    ],
    ids=["typo", "unknown", "missing"],
)
def test_a_sluice_class_called_with_a_wrong_keyword_is_one_line_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, expected: str
) -> None:
    name = f"wrong_call_{abs(hash(call))}"
    (tmp_path / f"{name}.py").write_text(
        "from spark_jobs import FileSource, PostgresSink\n\n" + f"thing = {call}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=f"^SLUICE_PIPELINES: module {name} \\(line 3 of .*\\): " + expected
    ):
        load_pipelines(Settings(pipelines=name))


def test_another_type_error_in_a_pipeline_module_keeps_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "own_type_error.py").write_text("def f(x):\n    return x\n\nf(1, 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        load_pipelines(Settings(pipelines="own_type_error"))


def test_a_postgres_sink_table_name_of_63_characters_is_accepted() -> None:
    """Postgres' longest name; the sink's batch tables have names of their own, so the target
    may use all of it (the limit was 55 while staging went through ``<table>__staged``)."""
    table = "t" * 63
    plan = orders(sink=PostgresSink(f"analytics.{table}")).plan
    assert plan.sink.options.table == ("analytics", table)
