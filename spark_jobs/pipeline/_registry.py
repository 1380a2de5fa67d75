"""Where pipelines live: the user's modules, named by ``SLUICE_PIPELINES`` (importable
from the Python path or the working directory).

Every :class:`Pipeline` object at the top level of a named module is registered (an object
imported into several modules counts once). Importing a module runs its definitions, so a
definition mistake surfaces here as the one-line :class:`PipelineDefinitionError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import sys
import traceback

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
        except TypeError as exc:
            line = _bad_call(name, exc)
            if line is None:
                raise
            raise ConfigError(_SETTING, line) from None
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


#: A call with a keyword the class does not take, or without one it needs.
_BAD_CALL = re.compile(
    r"^(?P<cls>\w+)\.__init__\(\) (got an unexpected keyword argument '(?P<kw>\w+)'"
    r"|missing \d+ required .*argument)"
)


def _bad_call(module: str, exc: TypeError) -> str | None:
    """One line for a definition that calls a Sluice class (a source, sink or step) with a
    keyword it does not take, or without one it needs — where, what, and the closest
    keyword — or None for any other TypeError (its traceback is the user's best help)."""
    import spark_jobs

    found = _BAD_CALL.match(str(exc))
    cls = getattr(spark_jobs, found["cls"], None) if found else None
    if found is None or not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != "<string>"]
    where = f" (line {frames[-1].lineno} of {frames[-1].filename})" if frames else ""
    hint = ""
    if found["kw"]:
        fields = [f.name for f in dataclasses.fields(cls)]
        close = difflib.get_close_matches(found["kw"], fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(fields)}"
    return f"module {module}{where}: {exc}{hint}"


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
