"""Type names mean in Sluice what they mean in Arrow, or are refused (issue 23): ``float`` is
64-bit in Python and 32-bit in Arrow and Spark, so it is an error naming the field and the two
names to write; messages print types by the names a pipeline writes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_jobs import FileSource, Map, Pipeline, PipelineDefinitionError
from spark_jobs.pipeline._types import AMBIGUOUS, arrow_type, type_name
from spark_jobs.sink._staged import conform_batch


@pytest.mark.parametrize("spelling", ["float", "FLOAT", " float "])
def test_float_is_refused_naming_the_field_and_what_to_write(spelling: str) -> None:
    with pytest.raises(PipelineDefinitionError) as refused:
        Pipeline(name="p", source=FileSource(schema={"reading": spelling}, partition_by=None))
    message = str(refused.value)
    assert message.startswith("pipeline p: source: field reading: 'float' is ambiguous")
    assert "'float64'" in message and "'float32'" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("spelling", "kind"),
    [("float32", pa.float32()), ("float64", pa.float64()), ("double", pa.float64())],
)
def test_the_unambiguous_names_mean_what_they_mean_in_arrow(
    spelling: str, kind: pa.DataType
) -> None:
    assert arrow_type(spelling, "f") == kind
    assert arrow_type(type_name(kind), "f") == kind  # what is printed reads back


def test_no_type_prints_as_an_ambiguous_name() -> None:
    for kind in (pa.float32(), pa.float64(), pa.int64(), pa.string()):
        assert type_name(kind) not in AMBIGUOUS
    assert type_name(pa.float32()) == "float32"
    assert type_name(pa.timestamp("us", tz="UTC")) == "timestamp"


def test_a_map_declaring_float_fails_at_definition() -> None:
    with pytest.raises(PipelineDefinitionError, match="ambiguous"):
        Pipeline(
            name="p",
            source=FileSource(schema={"x": "int64"}, partition_by=None),
            steps=[Map(lambda b: b, output={"y": "float"})],
        )


def test_a_batch_that_does_not_conform_prints_sluice_type_names() -> None:
    schema = pa.schema([pa.field("v", pa.float64())])
    batch = pa.RecordBatch.from_pydict({"v": pa.array([1.0], pa.float32())})
    with pytest.raises(ValueError, match="a batch has") as refused:
        conform_batch(batch, schema, "sink")
    assert str(refused.value) == "sink: a batch has (v float32), the output is (v float64)"
