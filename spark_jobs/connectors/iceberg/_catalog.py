"""Which Iceberg catalog a sink commits through, and where its tables are.

The default catalog is a PyIceberg ``SqlCatalog`` in the platform database itself (its
``iceberg_tables`` / ``iceberg_namespace_properties`` tables, in the database's default
schema, as the Java ``JdbcCatalog`` has them), with the warehouse
``<SLUICE_WAREHOUSE_DIR>/iceberg``. It is opened on the caller's SQLAlchemy engine, so the
database password stays inside the engine's URL object (rendered ``***`` everywhere) and is
never a catalog property. Any other catalog is a PyIceberg catalog by name, configured the
standard way (``PYICEBERG_CATALOG__<NAME>__URI`` … or ``.pyiceberg.yaml``).

Only the driver, the coordinator and recovery open a catalog; Spark tasks never do (they only
write Parquet files under the table's data folder).

Threading: a catalog object is used by one thread at a time (open one per use).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog, MetastoreCatalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchNamespaceError
from pyiceberg.table import Table
from sqlalchemy.engine import Engine

from enumerator_service import (
    ConfigError,
    Location,
    Settings,
    StorageOptions,
    connect_engine,
    database_url,
    open_location,
    redact_text,
)
from spark_jobs.pipeline._paths import warehouse_root

__all__ = [
    "DEFAULT_CATALOG",
    "catalog_engine",
    "data_root",
    "default_warehouse",
    "ensure_namespace",
    "file_io_properties",
    "location_of",
    "lock_name",
    "one_line",
    "open_catalog",
    "planned_location",
    "table_uri",
]

#: The name of Sluice's own catalog (``IcebergSink(catalog=None)``).
DEFAULT_CATALOG = "sluice"
#: The warehouse folder of Sluice's catalog, under ``SLUICE_WAREHOUSE_DIR``.
WAREHOUSE_FOLDER = "iceberg"


class _PlatformCatalog(SqlCatalog):
    """A ``SqlCatalog`` on an existing engine (no ``uri`` property: no password in it)."""

    def __init__(self, name: str, engine: Engine, **properties: str) -> None:
        MetastoreCatalog.__init__(self, name, **properties)
        self.engine = engine
        self._init_catalog()


def one_line(exc: BaseException, *urls: str) -> str:
    """An exception as one line without passwords (of ``urls``) or credentials in URLs."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_text(text, *urls)[:300]


def file_io_properties(storage: StorageOptions | None) -> dict[str, str]:
    """PyArrowFileIO properties: the S3 endpoint and region Sluice uses (credentials come
    from the process's own chain — environment, profile, instance role — never from here)."""
    props = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    if storage is not None and storage.s3_endpoint_url:
        props["s3.endpoint"] = storage.s3_endpoint_url
    if storage is not None and storage.s3_region:
        props["s3.region"] = storage.s3_region
    return props


def default_warehouse(settings: Settings) -> str:
    """``<SLUICE_WAREHOUSE_DIR>/iceberg`` as a URI (``file://…`` for a local folder)."""
    root = warehouse_root(settings).child(WAREHOUSE_FOLDER)
    return root.uri if root.object_store else f"file://{root.path}"


def catalog_engine(settings: Settings) -> Engine:
    """An engine on the platform database for a caller that has none (dispose it)."""
    return connect_engine(database_url(settings, create=False), pool_size=1)


def open_catalog(
    engine: Engine,
    name: str | None,
    storage: StorageOptions | None,
    warehouse: str | None = None,
    *,
    what: str = "IcebergSink(catalog)",
) -> Catalog:
    """The catalog ``name`` (None: Sluice's, on ``engine``; ``warehouse`` only matters to a
    table created through it). ConfigError(``what``) in one line when it cannot be opened."""
    url = engine.url.render_as_string(hide_password=False)
    try:
        if name is None:
            props = file_io_properties(storage)
            if warehouse is not None:
                props["warehouse"] = warehouse
            return _PlatformCatalog(DEFAULT_CATALOG, engine, **props)
        return load_catalog(name)
    except Exception as exc:  # any catalog implementation's own errors
        shown = DEFAULT_CATALOG if name is None else name
        problem = f"cannot open Iceberg catalog {shown!r}: {one_line(exc, url)}"
        raise ConfigError(what, problem) from None


def lock_name(catalog: str | None, table: str) -> str:
    """The ``table_lock`` name of a table (catalog-qualified)."""
    return f"iceberg:{catalog or DEFAULT_CATALOG}.{table}"


def data_root(table: Table, storage: StorageOptions | None) -> Location:
    """Where the table's data files go (``write.data.path``, else ``<location>/data``)."""
    given = table.properties.get("write.data.path") or f"{table.location().rstrip('/')}/data"
    return location_of(given, storage)


def location_of(uri: str, storage: StorageOptions | None) -> Location:
    """A table URI as a Sluice Location (``file://`` → a local folder)."""
    if uri.startswith("file://"):
        uri = uri.removeprefix("file://")
    elif uri.startswith("file:"):
        uri = uri.removeprefix("file:")
    return open_location(uri, storage, what="Iceberg table location")


def table_uri(path: str) -> str:
    """A data file's path as the table records it (a URI; ``file://`` for a local one)."""
    return path if "://" in path else f"file://{path}"


def planned_location(catalog: Catalog, namespace: str, name: str) -> str | None:
    """Where ``catalog`` puts a new table ``namespace.name`` (None: it decides on creation)."""
    resolve: Any = getattr(catalog, "_resolve_table_location", None)
    if resolve is None:
        return None
    try:
        location: str = resolve(None, namespace, name)
    except NoSuchNamespaceError:
        warehouse = catalog.properties.get("warehouse")
        return None if warehouse is None else f"{warehouse.rstrip('/')}/{namespace}/{name}"
    return location


def ensure_namespace(catalog: Catalog, namespace: str, warehouse: str | None) -> None:
    """Create ``namespace`` when missing (in Sluice's catalog with its location under the
    warehouse, so later table creations need no warehouse setting)."""
    props = {} if warehouse is None else {"location": f"{warehouse.rstrip('/')}/{namespace}"}
    catalog.create_namespace_if_not_exists(namespace, props)
