"""One registry of connectors, keyed by the type of their spec (and by name, for plans and
stored rows that carry the name).

A connector folder registers itself when imported (``register_source(FileSource,
FilesConnector())``); the built-in ones are imported by ``spark_jobs.connectors``, a user's
by the module that defines its spec (a pipeline module named in ``SLUICE_PIPELINES`` imports
it). A Spark task gets the run's connectors with its configuration and registers them when
its process has not (``ensure_registered``: a connector defined in a pipeline module that
is shipped to the workers by value never runs its module's registration there).

Threading: registration happens at import time (under the import lock); lookups are reads of
plain dicts, safe from any thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.connectors._interface import SinkConnector, SourceConnector

__all__ = [
    "ensure_registered",
    "register_sink",
    "register_source",
    "registered_sinks",
    "registered_sources",
    "sink_connector",
    "sink_connector_named",
    "source_connector",
    "source_connector_for_split",
    "source_connector_named",
]

_SOURCES: dict[type, SourceConnector] = {}
_SINKS: dict[type, SinkConnector] = {}
_SOURCE_NAMES: dict[str, SourceConnector] = {}
_SINK_NAMES: dict[str, SinkConnector] = {}


def _register(
    by_type: dict[type, Any], by_name: dict[str, Any], spec: type, connector: Any
) -> None:
    if not isinstance(spec, type):
        raise TypeError(f"register a spec class, not {spec!r}")
    name = connector.name
    if not name or not isinstance(name, str):
        raise ValueError(f"connector {type(connector).__name__} has no name")
    known = by_name.get(name)
    if known is not None and type(known) is not type(connector):
        raise ValueError(f"connector name {name!r} is taken by {type(known).__name__}")
    by_type[spec] = connector
    by_name[name] = connector


def register_source(spec: type, connector: SourceConnector) -> None:
    """Make ``spec`` values usable as a pipeline's ``source`` (again: replaces)."""
    _register(_SOURCES, _SOURCE_NAMES, spec, connector)


def register_sink(spec: type, connector: SinkConnector) -> None:
    """Make ``spec`` values usable as a pipeline's ``sink`` (again: replaces)."""
    _register(_SINKS, _SINK_NAMES, spec, connector)


def ensure_registered(spec: type, connector: SourceConnector | SinkConnector) -> None:
    """Register ``connector`` for ``spec`` unless a connector of that name is known (a
    Spark task registering the connectors its pipeline came with)."""
    from spark_jobs.connectors._interface import SourceConnector

    if isinstance(connector, SourceConnector):
        if connector.name not in _SOURCE_NAMES:
            register_source(spec, connector)
    elif connector.name not in _SINK_NAMES:
        register_sink(spec, connector)


def _lookup(by_type: dict[type, Any], spec: object) -> Any:
    for kind in type(spec).__mro__:
        found = by_type.get(kind)
        if found is not None:
            return found
    return None


def source_connector(spec: object) -> SourceConnector | None:
    """The connector of a source spec value, or None when its type is not registered."""
    found: SourceConnector | None = _lookup(_SOURCES, spec)
    return found


def sink_connector(spec: object) -> SinkConnector | None:
    """The connector of a sink spec value, or None when its type is not registered."""
    found: SinkConnector | None = _lookup(_SINKS, spec)
    return found


def source_connector_named(name: str) -> SourceConnector:
    """The source connector called ``name`` (KeyError naming the known ones)."""
    try:
        return _SOURCE_NAMES[name]
    except KeyError:
        raise KeyError(f"no source connector {name!r} (known: {sorted(_SOURCE_NAMES)})") from None


def sink_connector_named(name: str) -> SinkConnector:
    """The sink connector called ``name`` (KeyError naming the known ones)."""
    try:
        return _SINK_NAMES[name]
    except KeyError:
        raise KeyError(f"no sink connector {name!r} (known: {sorted(_SINK_NAMES)})") from None


def source_connector_for_split(kind: str) -> SourceConnector:
    """The source connector whose reader reads splits of ``kind``."""
    for connector in _SOURCE_NAMES.values():
        if kind in connector.split_kinds:
            return connector
    raise KeyError(f"no source connector reads splits of kind {kind!r}")


def registered_sources() -> dict[type, SourceConnector]:
    return dict(_SOURCES)


def registered_sinks() -> dict[type, SinkConnector]:
    return dict(_SINKS)
