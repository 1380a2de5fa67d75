"""How the derivation of a plan reports problems, and the checks its parts share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import pyarrow as pa

from spark_jobs.pipeline._errors import PipelineDefinitionError, check_field_name
from spark_jobs.pipeline._plan import Column
from spark_jobs.pipeline._types import seconds

__all__ = [
    "Context",
    "names",
    "optional_int",
    "optional_seconds",
    "output_mode",
    "require",
]


class Context:
    """Raises errors that name the pipeline and the part being checked."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.where = ""

    def fail(self, problem: str) -> PipelineDefinitionError:
        return PipelineDefinitionError(self.pipeline, self.where, problem)

    def check(self, check: Callable[..., Any], *args: Any) -> Any:
        """``check(*args)``; its ValueError becomes a definition error naming this part."""
        try:
            return check(*args)
        except ValueError as exc:
            raise self.fail(str(exc)) from None


def names(ctx: Context, names: object, what: str) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence | frozenset | set):
        raise ctx.fail(f"{what}s must be a list of field names, got {names!r}")
    return [ctx.check(check_field_name, n, what) for n in names]


def require(ctx: Context, names: Sequence[str], columns: Sequence[Column], what: str) -> None:
    known = [c.name for c in columns]
    for name in names:
        if name not in known:
            raise ctx.fail(f"{what} {name!r} is not in the input (fields: {', '.join(known)})")


def optional_seconds(
    ctx: Context, value: Any, what: str, *, positive: bool = False
) -> float | None:
    if value is None:
        return None
    result: float = ctx.check(seconds, value, what)
    if positive and result <= 0:
        raise ctx.fail(f"{what} must be > 0")
    return result


def optional_int(ctx: Context, value: Any, what: str, minimum: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ctx.fail(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


Mode = Literal["ordered", "unordered", "key"]


def output_mode(
    ctx: Context, mode: object, key: object, inputs: Sequence[Column], is_open: bool
) -> tuple[Mode, tuple[str, ...] | None]:
    """An async step's ``mode`` and ``key``: the key (field names of the step's input) is
    required with mode ``"key"`` and refused with the others. A key field must be a scalar
    (records are grouped by its value); checked once the input is known."""
    if mode not in ("ordered", "unordered", "key"):
        raise ctx.fail(f"mode must be 'ordered', 'unordered' or 'key', got {mode!r}")
    if mode != "key":
        if key is not None:
            raise ctx.fail(f"key {key!r} is only for mode='key' (mode is {mode!r})")
        return mode, None
    if key is None:
        raise ctx.fail("mode='key' needs key=: the field (or fields) whose records keep order")
    fields = (key,) if isinstance(key, str) else tuple(names(ctx, key, "key field"))
    if not fields:
        raise ctx.fail("key must name at least one field")
    for name in fields:
        ctx.check(check_field_name, name, "key field")
    if not is_open:
        require(ctx, fields, inputs, "key field")
        for column in inputs:
            kind = column.type
            if column.name in fields and kind is not None and pa.types.is_nested(kind):
                raise ctx.fail(f"key field {column.name!r} is {kind}: a key field is a scalar")
    return "key", fields


#: The Parquet codecs a file sink writes with (pyarrow's names; "none": uncompressed).
PARQUET_COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "brotli", "none")


def parquet_compression(ctx: Context, value: object) -> str:
    """A sink's ``compression`` option: one of :data:`PARQUET_COMPRESSIONS`."""
    if value not in PARQUET_COMPRESSIONS:
        raise ctx.fail(f"compression must be one of {', '.join(PARQUET_COMPRESSIONS)}")
    return str(value)


def upsert_key(
    ctx: Context, value: object, columns: Sequence[Column], is_open: bool
) -> tuple[str, ...] | None:
    """A sink's ``upsert_key`` option: None (append), or at least one field name, each an
    output field (checked once the output is known: ``is_open`` False)."""
    if value is None:
        return None
    key = tuple(names(ctx, value, "upsert_key field"))
    if not key:
        raise ctx.fail("upsert_key must name at least one field (or be None: append)")
    if not is_open:
        require(ctx, key, columns, "upsert_key field")
    return key
