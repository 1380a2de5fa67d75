"""Getting a pipeline's user code to the Spark workers.

Spark pickles the task closure with cloudpickle, which pickles a function or class *by
reference* (module and name) when its module is importable — on the driver. A worker must
then import the same module, which holds for installed packages but not for a user's module
that is importable only from the driver's working directory or ``sys.path`` (a test module,
a notebook's helpers). The modules of a pipeline's own code are therefore registered to be
pickled *by value*: the workers need nothing but Sluice and the libraries it uses.

Threading: driver only, before the Spark job is submitted.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._plan import AsyncMapPlan, MapPlan

__all__ = ["ship_by_value", "user_modules"]

_PLATFORM = ("enumerator_service", "spark_jobs", "dagster_project")


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")]


def _objects(pipeline: Pipeline) -> Iterator[Any]:
    yield pipeline.sample_data
    for stage in pipeline.plan.stages:
        if isinstance(stage, AsyncMapPlan | MapPlan):
            yield stage.function


def user_modules(pipeline: Pipeline) -> list[ModuleType]:
    """The modules holding the pipeline's functions and classes that are neither Sluice's
    nor installed (standard library, site-packages)."""
    roots = _installed_roots()
    found: dict[str, ModuleType] = {}
    for obj in _objects(pipeline):
        if obj is None:
            continue
        name = getattr(obj, "__module__", None) or type(obj).__module__
        module = sys.modules.get(name)
        if module is None or name.split(".")[0] in _PLATFORM or name == "builtins":
            continue
        file = getattr(module, "__file__", None)
        if file is not None and any(Path(file).resolve().is_relative_to(r) for r in roots):
            continue
        found[name] = module
    return list(found.values())


def ship_by_value(pipeline: Pipeline) -> list[str]:
    """Register the pipeline's user modules with PySpark's cloudpickle to be pickled by
    value; returns their names."""
    from pyspark import cloudpickle

    modules = user_modules(pipeline)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return [module.__name__ for module in modules]
