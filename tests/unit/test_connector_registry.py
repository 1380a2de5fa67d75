"""The connector registry as a pipeline definition meets it: an unregistered spec, a spec that
lacks the shared source fields, and the by-name lookups the tasks use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from spark_jobs.connectors import (
    FileSource,
    ReaderContext,
    SourceConnector,
    SourceDetails,
    ValidationContext,
    ensure_registered,
    register_source,
    source_connector,
    source_connector_for_split,
    source_connector_named,
)
from spark_jobs.pipeline import Pipeline, PipelineDefinitionError


@dataclass(frozen=True)
class BareSource:
    """A spec without the fields every source has (schema, required, event_time, …)."""

    rows: int = 3


class BareConnector(SourceConnector):
    name = "test_bare"
    split_kinds = ("test_bare",)

    def validate(self, spec: Any, ctx: ValidationContext) -> SourceDetails:
        return SourceDetails(None)

    def describe(self, plan: Any, pipeline: str, where: str | None = None) -> str:
        return "bare"

    def discovery(self, pipeline: Any, settings: Any) -> Any:
        raise NotImplementedError

    def split_reader(self, schema: Any, context: ReaderContext) -> Any:
        raise NotImplementedError


def test_a_spec_without_the_shared_fields_is_one_line_naming_them() -> None:
    register_source(BareSource, BareConnector())
    with pytest.raises(PipelineDefinitionError) as caught:
        Pipeline("bare", BareSource())
    message = str(caught.value)
    assert "\n" not in message
    assert "pipeline bare" in message and "source" in message
    assert "required" in message and "schema" in message


def test_an_unregistered_spec_names_the_registered_ones() -> None:
    @dataclass(frozen=True)
    class Unknown:
        schema: dict[str, str]

    with pytest.raises(PipelineDefinitionError, match=r"registered source spec .*FileSource"):
        Pipeline("unknown", Unknown({"a": "string"}))


def test_lookups_by_spec_name_and_split_kind_agree() -> None:
    files = source_connector(FileSource(schema={"a": "string"}))
    assert files is source_connector_named("files")
    assert source_connector_for_split("csv.gz") is files
    with pytest.raises(KeyError, match="no source connector reads splits of kind"):
        source_connector_for_split("nothing")


def test_a_task_registers_a_connector_its_process_lacks() -> None:
    @dataclass(frozen=True)
    class Shipped:
        schema: dict[str, str]

    class ShippedConnector(BareConnector):
        name = "test_shipped"
        split_kinds = ("test_shipped",)

    connector = ShippedConnector()
    ensure_registered(Shipped, connector)
    assert source_connector_named("test_shipped") is connector
    ensure_registered(Shipped, ShippedConnector())  # known by name: the first one stays
    assert source_connector_named("test_shipped") is connector
