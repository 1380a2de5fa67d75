"""Where pipelines live: the user's modules, named by ``SLUICE_PIPELINES`` (importable
from the Python path or the working directory).

Every :class:`Pipeline` object at the top level of a named module is registered (an object
imported into several modules counts once). Importing a module runs its definitions, so a
definition mistake surfaces here as the one-line :class:`PipelineDefinitionError`.
"""

from __future__ import annotations

import importlib
import os
import sys

from enumerator_service import ConfigError, Settings
from spark_jobs.pipeline._definition import Pipeline

__all__ = ["load_pipelines", "pick_pipeline"]

_SETTING = "SLUICE_PIPELINES"


def load_pipelines(settings: Settings) -> dict[str, Pipeline]:
    """The registered pipelines by name, in module and definition order."""
    found: dict[str, Pipeline] = {}
    where: dict[str, str] = {}
    # Like ``python -m``: the user's modules are importable from the working directory.
    if settings.pipeline_modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for name in settings.pipeline_modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                raise ConfigError(_SETTING, f"no module named {name!r}") from None
            raise ConfigError(_SETTING, f"importing {name}: {exc}") from None
        pipelines = [value for value in vars(module).values() if isinstance(value, Pipeline)]
        if not pipelines:
            raise ConfigError(_SETTING, f"module {name} defines no Pipeline at its top level")
        for pipeline in pipelines:
            if pipeline.name in found and found[pipeline.name] is not pipeline:
                raise ConfigError(
                    _SETTING,
                    f"two pipelines are named {pipeline.name!r} ({where[pipeline.name]}, {name})",
                )
            found.setdefault(pipeline.name, pipeline)
            where.setdefault(pipeline.name, name)
    return found


def pick_pipeline(pipelines: dict[str, Pipeline], name: str | None) -> Pipeline:
    """The pipeline ``name``, or the only registered one when ``name`` is None."""
    if not pipelines:
        raise ConfigError(
            _SETTING, "no pipelines registered (set it to your modules, e.g. examples.orders)"
        )
    if name is None:
        if len(pipelines) > 1:
            raise ConfigError("PIPELINE", f"name one of the pipelines: {', '.join(pipelines)}")
        return next(iter(pipelines.values()))
    if name not in pipelines:
        raise ConfigError("PIPELINE", f"no pipeline {name!r} (registered: {', '.join(pipelines)})")
    return pipelines[name]
