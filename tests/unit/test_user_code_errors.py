"""Deterministic errors of the pipeline's own code are :class:`UserCodeError`s whose one
line names the step, the field and the record (split and offset), and are told apart from
transient errors (issue 21)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spark_jobs import FileSource, Filter, Map, Pipeline
from spark_jobs.jobs._stages import FilterStage, MapStage
from spark_jobs.jobs._user_errors import UserCodeError, deterministic_error
from spark_jobs.source._batch import Batch, with_offsets


def _stages(step: Any) -> Any:
    pipeline = Pipeline(
        name="p", source=FileSource(schema={"x": "int64"}, partition_by=None), steps=[step]
    )
    return pipeline.plan.stages[0]


def _batch(values: list[int]) -> Batch:
    rows = pa.RecordBatch.from_pydict({"x": pa.array(values, pa.int64())})
    offsets = [100 + 10 * i for i in range(len(values))]
    return Batch(7, with_offsets(rows, offsets), (100, 100 + 10 * len(values)))


def _run(stage: Any, batch: Batch) -> UserCodeError:
    stage.downstream = lambda _batch: None
    with pytest.raises(UserCodeError) as raised:
        stage.process(batch)
    return raised.value


def _as_text(batch: pa.RecordBatch) -> pa.RecordBatch:
    x = batch.column("x")
    text = pc.if_else(pc.equal(x, 3), "n/a", pc.cast(x, pa.string()))
    return batch.append_column("score", text)


def test_a_value_that_does_not_fit_its_declared_type_names_field_and_record() -> None:
    error = _run(MapStage(_stages(Map(_as_text, output={"score": "double"}))), _batch([1, 2, 3]))
    assert str(error) == (
        "step 1 (Map _as_text): field 'score': is string, not float64 (value 'n/a'): Failed "
        "to parse string: 'n/a' as a scalar of type double (record: split 7 offset 120)"
    )
    named = error.named("orders", "/landing/a.csv")
    assert str(named).startswith("pipeline orders: step 1 (Map _as_text): field 'score'")
    assert str(named).endswith("(record: split 7 (/landing/a.csv) offset 120)")
    assert deterministic_error(RuntimeError("wrapped")) is None


def _drops_y(batch: pa.RecordBatch) -> pa.RecordBatch:
    y = pc.multiply(batch.column("x"), 2)
    added = batch.append_column("y", y)
    return added.drop_columns(["y"]) if len(batch) else added  # only on real data


def test_a_declared_field_missing_from_the_result_is_one_line() -> None:
    error = _run(MapStage(_stages(Map(_drops_y, output={"y": "int64"}))), _batch([5, 6]))
    assert str(error) == (
        "step 1 (Map _drops_y): field 'y': the result has no such field "
        "(record: split 7 offset 100)"
    )


def _raises(batch: pa.RecordBatch) -> pa.RecordBatch:
    if len(batch):
        raise ZeroDivisionError("division by zero")
    return batch


def test_a_map_that_raises_is_deterministic_and_keeps_its_cause() -> None:
    error = _run(MapStage(_stages(Map(_raises))), _batch([1]))
    assert str(error) == (
        "step 1 (Map _raises): raised ZeroDivisionError: division by zero "
        "(record: split 7 offset 100)"
    )
    assert isinstance(error.__cause__, ZeroDivisionError)
    assert deterministic_error(RuntimeError("task failed")) is None
    outer = RuntimeError("task failed")
    outer.__cause__ = error  # as `raise … from` leaves it
    assert deterministic_error(outer) == str(error)


def _calls_out(batch: pa.RecordBatch) -> pa.RecordBatch:
    if len(batch):
        raise ConnectionResetError("peer reset")
    return batch


def test_a_map_whose_call_out_fails_stays_transient() -> None:
    stage = MapStage(_stages(Map(_calls_out)))
    stage.downstream = lambda _batch: None
    with pytest.raises(ConnectionResetError):
        stage.process(_batch([1]))


def test_a_filter_that_does_not_fit_its_records_is_one_line() -> None:
    stage = FilterStage(_stages(Filter(pc.field("x") > 0)))
    rows = pa.RecordBatch.from_pydict({"x": pa.array(["a"], pa.string())})
    error = _run(stage, Batch(3, with_offsets(rows, [42]), (42, 43)))
    text = str(error)
    assert text.startswith("step 1 (Filter (x > 0)): ") and "\n" not in text
    assert text.endswith("(record: split 3 offset 42)")


class _UndefinedColumn(Exception):
    sqlstate = "42703"


class _ConnectionLost(Exception):
    sqlstate = "08006"


def test_postgres_refusing_a_query_is_deterministic_and_a_lost_connection_is_not() -> None:
    line = deterministic_error(_UndefinedColumn('column "name" does not exist'))
    assert line == ('the database refused a query (_UndefinedColumn: column "name" does not exist)')
    assert deterministic_error(_ConnectionLost("terminating connection")) is None
    assert deterministic_error(TimeoutError()) is None
