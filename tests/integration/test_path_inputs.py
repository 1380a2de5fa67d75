"""Every path built from outside input stays under its root (issue 13, path traversal).

Each entry point that turns outside input into a path part gets the same hostile values —
``/``, ``..``, ``a/../../b``, NUL, 5000 characters, empty, absolute paths — and must refuse
with one line naming the input, while nothing outside the data root is created or deleted
(a sentinel file beside the warehouse survives, the listing of the test folder is the same).
The Dagster run tag and partition key are in ``tests/dagster/test_run_tag_paths.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import TestSettings
from hostile_inputs import HOSTILE, tree

from enumerator_service import ConfigError
from enumerator_service._safe_paths import child_path, partition_date, relative_under, safe_name
from spark_jobs import FileSource, ParquetSink, Pipeline
from spark_jobs.cli import main
from spark_jobs.jobs import ReaderRun, run_pipeline
from spark_jobs.pipeline import PipelineDefinitionError
from spark_jobs.sink._parquet import ParquetSinkWriter


#: What a hostile caller tries; every one must be refused.
class Guarded:
    """A test folder with the data root inside it and a sentinel next to the warehouse."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.warehouse = self.root / "data" / "warehouse"
        (self.warehouse / "_staging" / "paths").mkdir(parents=True)
        self.sentinel = self.root / "data" / "sentinel.txt"
        self.sentinel.write_text("keep me")
        (base / "outside").mkdir()
        (base / "outside" / "victim.txt").write_text("keep me too")
        self.before = tree(base)

    def assert_untouched(self) -> None:
        """Nothing changed or deleted anywhere; nothing created outside the data root."""
        assert self.sentinel.read_text() == "keep me"
        after = tree(self.base)
        assert {k: after.get(k) for k in self.before} == self.before
        created = sorted(set(after) - set(self.before))
        assert all(Path(k).parts[0] == "root" for k in created), created


@pytest.fixture
def guarded(tmp_path: Path) -> Guarded:
    return Guarded(tmp_path)


def _pipeline(name: str = "paths", landing: str | None = "landing/paths") -> Pipeline:
    return Pipeline(
        name=name,
        source=FileSource(landing=landing, schema={"x": "int64"}, partition_by=None),
        sink=ParquetSink("paths"),
    )


# --------------------------------------------------------------------------- the helpers


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_safe_name_refuses_with_one_line_naming_the_input(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        safe_name(value, "run_id")
    message = str(caught.value)
    assert message.startswith("run_id: ") and "\n" not in message and len(message) < 200


@pytest.mark.parametrize(
    "value", ["run-20261123T230000-abcdef12", "dagster-4c1e", "live-run", "r1", "a.b_c-9"]
)
def test_safe_name_accepts_run_ids_sluice_and_dagster_make(value: str) -> None:
    assert safe_name(value, "run_id") == value


def test_child_path_refuses_a_symlink_out_of_its_root(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"^run_id: .* leads out of"):
        child_path(tmp_path / "root", "link", what="run_id")
    assert child_path(tmp_path / "root", "link", what="run_id", resolve=False).name == "link"


@pytest.mark.parametrize("given", ["..", "a/../../b", "../x", "a\x00b", "/abs"])
def test_relative_under_refuses_a_way_out(tmp_path: Path, given: str) -> None:
    with pytest.raises(ConfigError, match=r"^landing: "):
        relative_under(tmp_path, Path(given), "landing")


@pytest.mark.parametrize("key", [*HOSTILE.values(), "2026-13-01", "20260101", "2026-01-01/.."])
def test_partition_date_refuses_what_is_not_a_day(key: str) -> None:
    with pytest.raises(ConfigError, match=r"^partition key: "):
        partition_date(key, "partition key")


# --------------------------------------------------------------------------- entry points


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_run_pipeline_refuses_a_hostile_run_id(
    make_settings: Callable[..., TestSettings], guarded: Guarded, value: str
) -> None:
    settings = make_settings(home=guarded.root / "home", data_dir=guarded.root / "data")
    guarded.before = tree(guarded.base)  # (settings create nothing)
    with pytest.raises(ConfigError, match=r"^run_id: ") as caught:
        run_pipeline(settings, _pipeline(), run_id=value)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"^run_id: "):
        ReaderRun(settings, _pipeline(), run_id=value)
    guarded.assert_untouched()


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_parquet_sink_never_stages_outside_its_staging_root(
    guarded: Guarded, value: str
) -> None:
    """Inside a Spark task the run id arrives in the task config: checked again there."""
    with ThreadPoolExecutor(1) as io, pytest.raises(ConfigError, match=r"^run_id: "):
        ParquetSinkWriter(
            io,
            schema=pa.schema([("x", pa.int64())]),
            dictionary=[],
            compression="zstd",
            staging_root=guarded.warehouse / "_staging" / "paths",
            output_root=guarded.warehouse / "paths",
            run_id=value,
            subtask=0,
            attempt="a0",
        )
    guarded.assert_untouched()


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_pipeline_api_refuses_a_hostile_pipeline_or_table_name(value: str) -> None:
    with pytest.raises(PipelineDefinitionError, match="pipeline name"):
        _pipeline(name=value)
    with pytest.raises(PipelineDefinitionError, match="sink: table"):
        Pipeline(
            name="paths",
            source=FileSource(landing="x", schema={"x": "int64"}, partition_by=None),
            sink=ParquetSink(value or "/"),
        )


@pytest.mark.parametrize("value", ["..", "a/../../b", "../../outside", "x/..", "a\x00b", ""])
def test_the_pipeline_api_refuses_a_relative_landing_that_leaves_the_data_folder(
    value: str,
) -> None:
    with pytest.raises(PipelineDefinitionError, match="pipeline paths: source: landing") as caught:
        _pipeline(landing=value)
    assert "\n" not in str(caught.value)


def _sluice(argv: list[str], settings: TestSettings, monkeypatch: pytest.MonkeyPatch) -> int:
    """``sluice ARGV`` in this process (a NUL cannot pass through a real argv): its exit
    code."""
    assert settings.database_url is not None
    monkeypatch.setenv("SLUICE_DATABASE_URL", settings.database_url.get_secret_value())
    monkeypatch.setenv("SLUICE_HOME", str(settings.home))
    monkeypatch.setenv("SLUICE_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("SLUICE_PIPELINES", "cli_paths_module")
    with pytest.raises(SystemExit) as caught:
        main(argv)
    return int(caught.value.code or 0)


@pytest.fixture
def cli_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "module"
    folder.mkdir()
    (folder / "cli_paths_module.py").write_text(
        "from spark_jobs import FileSource, ParquetSink, Pipeline\n"
        "paths = Pipeline(name='paths', source=FileSource(schema={'x': 'int64'}),"
        " sink=ParquetSink('paths'))\n"
    )
    monkeypatch.syspath_prepend(str(folder))


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_sluice_run_refuses_hostile_arguments(
    make_settings: Callable[..., TestSettings],
    guarded: Guarded,
    cli_module: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: str,
) -> None:
    settings = make_settings(home=guarded.root / "home", data_dir=guarded.root / "data")
    guarded.before = tree(guarded.base)
    for argv in (["run", value], ["run", "paths", "--date", value], ["demo-data", value]):
        code = _sluice(argv, settings, monkeypatch)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    guarded.assert_untouched()
