"""``docker/``: healthchecks, start-up order, run monitoring, Spark drivers executors can reach,
and the Spark daemons' shared secret — checked without a Docker engine.

The compose file is parsed with the helpers of ``test_deployment``; ``dagster.yaml`` is loaded
as a real DagsterInstance (SQLite in place of Postgres); the Spark healthchecks run against a
real standalone master and worker started from pyspark's ``spark-class`` on 127.0.0.1.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import copy
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deployment import (
    COMPOSE_FILE,
    DAGSTER_YAML,
    DOCKER,
    DUMMY_SECRETS,
    ENV_EXAMPLE,
    command_of,
    container_environment,
    dockerfile_env,
    parse_env_file,
    resolve,
    service_environment,
)

SPARK_MASTER = "org.apache.spark.deploy.master.Master"
SPARK_WORKER = "org.apache.spark.deploy.worker.Worker"
#: Services that start Spark drivers (executors connect back to them).
DRIVER_SERVICES = ("sluice-cli", "dagster-daemon")

# --------------------------------------------------------------------------- helpers


def healthcheck_test(service: Mapping[str, Any]) -> list[str]:
    """The healthcheck's command as argv (``CMD`` form), or ``["sh", "-c", …]`` (shell form);
    empty when there is none or it is disabled."""
    check = service.get("healthcheck") or {}
    test = check.get("test")
    if check.get("disable") or not test or test == ["NONE"]:
        return []
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *argv = test
    return argv if kind == "CMD" else ["sh", "-c", " ".join(argv)]


def one_shot(service: Mapping[str, Any]) -> bool:
    return str(service.get("restart", "no")) == "no"


def health_problems(compose: Mapping[str, Any]) -> list[str]:
    """Long-running services without a healthcheck; one-shot services whose dependents do not
    wait for them to complete; dependencies that do not wait for the health they could."""
    services = compose.get("services") or {}
    problems = []
    for name, service in services.items():
        if not one_shot(service) and not healthcheck_test(service):
            problems.append(f"{name} has no healthcheck")
        for dep, spec in (service.get("depends_on") or {}).items():
            condition = (spec or {}).get("condition", "service_started")
            target = services.get(dep) or {}
            wanted = (
                "service_completed_successfully"
                if one_shot(target)
                else "service_healthy"
                if healthcheck_test(target)
                else "service_started"
            )
            if condition != wanted:
                problems.append(f"{name} waits for {dep} with {condition}, not {wanted}")
    return problems


def option(command: list[str], flag: str, default: str | None = None) -> str | None:
    return command[command.index(flag) + 1] if flag in command else default


def python_code(argv: list[str]) -> str | None:
    """The program of a ``python -c CODE`` healthcheck."""
    if argv[:2] == ["python", "-c"] and len(argv) == 3:
        return argv[2]
    return None


def probe_problems(compose: Mapping[str, Any]) -> list[str]:
    """Each healthcheck probes what its service serves: Postgres with pg_isready, the Spark
    master's and worker's UI on their --webui-port, the webserver's /server_info on its -p
    port, the daemon with ``dagster-daemon liveness-check``; Python probes compile."""
    problems = []
    for name, service in (compose.get("services") or {}).items():
        argv, command = healthcheck_test(service), command_of(service)
        text = " ".join(argv)
        code = python_code(argv)
        if code is not None:
            try:
                compile(code, f"{name} healthcheck", "exec")
            except SyntaxError as exc:
                problems.append(f"{name}: healthcheck is not Python: {exc.msg}")
        if str(service.get("image", "")).startswith("postgres") and "pg_isready" not in text:
            problems.append(f"{name}: healthcheck does not run pg_isready")
        for cls, default in ((SPARK_MASTER, "8080"), (SPARK_WORKER, "8081")):
            if cls in command:
                port = option(command, "--webui-port", default)
                if f"127.0.0.1:{port}/json/" not in text:
                    problems.append(f"{name}: healthcheck does not ask its UI on port {port}")
        if command[:1] == ["dagster-webserver"]:
            port = option(command, "-p", "3000")
            if f"127.0.0.1:{port}/server_info" not in text:
                problems.append(f"{name}: healthcheck does not ask /server_info on {port}")
        if command[:2] == ["dagster-daemon", "run"] and argv != [
            "dagster-daemon",
            "liveness-check",
        ]:
            problems.append(f"{name}: healthcheck is not dagster-daemon liveness-check")
    return problems


def driver_problems(
    compose: Mapping[str, Any], environments: Mapping[str, dict[str, str]]
) -> list[str]:
    """A service that starts Spark drivers advertises a name executors can resolve: its own
    service name (compose's DNS alias), set as its hostname and SLUICE_SPARK_DRIVER_HOST."""
    problems = []
    for name in DRIVER_SERVICES:
        service = compose["services"][name]
        host = environments[name].get("SLUICE_SPARK_DRIVER_HOST")
        if host != name:
            problems.append(f"{name}: SLUICE_SPARK_DRIVER_HOST is {host!r}, not {name!r}")
        if service.get("hostname") != name:
            problems.append(f"{name}: hostname is {service.get('hostname')!r}, not {name!r}")
    return problems


def run_commands_without_aliases(markdown: str) -> list[str]:
    """``docker compose … run`` lines that start a Spark driver (``sluice run``) without
    ``--use-aliases`` (or ``--name`` with a matching SLUICE_SPARK_DRIVER_HOST)."""
    bad = []
    for line in markdown.splitlines():
        words = line.split()
        if "compose" in words and "run" in words and "sluice run" in line:
            named = "--name" in words and "SLUICE_SPARK_DRIVER_HOST=" in line
            if "--use-aliases" not in words and not named:
                bad.append(line.strip())
    return bad


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dotenv() -> dict[str, str]:
    values, _ = parse_env_file(ENV_EXAMPLE.read_text())
    return {**{name: value for name, value in values.items() if value}, **DUMMY_SECRETS}


@pytest.fixture(scope="module")
def compose(dotenv: dict[str, str]) -> dict[str, Any]:
    resolved = resolve(yaml.safe_load(COMPOSE_FILE.read_text()), dotenv)
    assert isinstance(resolved, dict)
    return resolved


@pytest.fixture(scope="module")
def environments(compose: dict[str, Any], dotenv: dict[str, str]) -> dict[str, dict[str, str]]:
    image = dockerfile_env((DOCKER / "Dockerfile").read_text())
    env_file = {k: v for k, v in dotenv.items() if k not in DUMMY_SECRETS}
    return {
        name: container_environment(service, image if "build" in service else {}, env_file)
        for name, service in compose["services"].items()
    }


# --------------------------------------------------------------------------- compose


def test_every_long_running_service_has_a_healthcheck_that_its_dependents_wait_for(
    compose: dict[str, Any],
) -> None:
    assert health_problems(compose) == []
    services = compose["services"]
    one_shots = {name for name, service in services.items() if one_shot(service)}
    assert one_shots == {"sluice-cli"}
    assert {name for name, service in services.items() if healthcheck_test(service)} == set(
        services
    ) - one_shots
    # Start-up order: databases healthy -> migrations -> Dagster; master healthy -> workers
    # and the daemon (which starts the drivers).
    assert services["dagster-daemon"]["depends_on"]["spark-master"]["condition"] == (
        "service_healthy"
    )
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == (
        "service_healthy"
    )


def test_healthchecks_probe_what_each_service_serves(compose: dict[str, Any]) -> None:
    assert probe_problems(compose) == []
    # The programs they run exist: python and dagster-daemon in the image (installed here as
    # in the image), pg_isready in the Postgres image (not checkable here).
    bin_dir = Path(sys.executable).parent
    for name, service in compose["services"].items():
        argv = healthcheck_test(service)
        if argv and "build" in service:
            assert argv[0] == "python" or (bin_dir / argv[0]).is_file(), name
    liveness = subprocess.run(
        [str(bin_dir / "dagster-daemon"), "liveness-check", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert liveness.returncode == 0, liveness.stderr


def test_spark_drivers_are_reachable_by_executors(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    assert driver_problems(compose, environments) == []
    # The documented one-off driver: `docker compose run` needs --use-aliases for the service
    # name to resolve (or --name with the matching driver host).
    readme = (DOCKER / "README.md").read_text()
    assert "--use-aliases sluice-cli sluice run" in readme
    assert run_commands_without_aliases(readme) == []
    top = (DOCKER.parent / "README.md").read_text()
    assert run_commands_without_aliases(top) == []


def test_spark_daemons_and_tasks_get_their_secrets_from_the_environment(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    services = compose["services"]
    daemons = [
        name
        for name, service in services.items()
        if {SPARK_MASTER, SPARK_WORKER} & set(command_of(service))
    ]
    assert sorted(daemons) == ["spark-master", "spark-worker"]
    for name in daemons:
        env = service_environment(services[name])
        # Spark's own variable for the spark.authenticate secret: never on a command line.
        assert env["_SPARK_AUTH_SECRET"] == DUMMY_SECRETS["SLUICE_SPARK_AUTH_SECRET"], name
        assert "-Dspark.authenticate=true" in shlex.split(env["SPARK_DAEMON_JAVA_OPTS"]), name
        assert "secret" not in env["SPARK_DAEMON_JAVA_OPTS"].lower(), name
        assert "secret" not in " ".join(command_of(services[name])).lower(), name
    # Tasks on the workers read the platform database URL from their environment.
    assert (
        environments["spark-worker"]["SLUICE_DATABASE_URL"]
        == (environments["sluice-cli"]["SLUICE_DATABASE_URL"])
    )


# --------------------------------------------------------------------------- dagster.yaml


def _instance_dir(tmp_path: Path, **run_monitoring: Any) -> Path:
    config = yaml.safe_load(DAGSTER_YAML.read_text())
    config["storage"] = {"sqlite": {"base_dir": str(tmp_path / "storage")}}
    config["run_monitoring"].update(run_monitoring)
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return home


def test_dagster_yaml_monitors_runs_as_its_launcher_allows(tmp_path: Path) -> None:
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(_instance_dir(tmp_path))) as instance:
        assert instance.run_monitoring_enabled
        assert 0 < instance.run_monitoring_start_timeout_seconds <= 600
        assert 0 < instance.run_monitoring_cancel_timeout_seconds <= 600
        # The launcher can neither check a STARTED run's worker nor resume it: 0 attempts,
        # and STARTED runs are the continuous sensor's business (lease heartbeat).
        assert not instance.run_launcher.supports_resume_run
        assert not instance.run_launcher.supports_check_run_worker_health
        assert instance.run_monitoring_max_resume_run_attempts == 0
    # Dagster refuses resume attempts with this launcher: why the file says 0.
    refused = _instance_dir(tmp_path / "resume", max_resume_run_attempts=1)
    with pytest.raises(Exception, match="does not support resuming runs"):
        DagsterInstance.from_config(str(refused))


# --------------------------------------------------------------------------- real Spark daemons


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _local_probe(argv: list[str], port: int, local_port: int) -> list[str]:
    """The compose probe with the container's UI port replaced by the local one."""
    code = python_code(argv)
    assert code is not None
    return [sys.executable, "-c", code.replace(f":{port}/", f":{local_port}/")]


def _probe_until(argv: list[str], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        code = subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode
        if code == 0 or time.monotonic() > deadline:
            return code
        time.sleep(1)


@pytest.fixture
def spark_daemons(tmp_path: Path) -> Iterator[Any]:
    """Starts Spark daemons (stopped at the end, also on failure)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java")
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    started: list[subprocess.Popen[bytes]] = []

    def start(cls: str, args: list[str], env: dict[str, str], name: str) -> None:
        log = (tmp_path / f"{name}.log").open("wb")
        started.append(
            subprocess.Popen(
                [str(spark_home / "bin" / "spark-class"), cls, *args],
                # As in compose: no SPARK_LOCAL_IP (the UIs bind every interface).
                env={
                    **{k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"},
                    "SPARK_HOME": str(spark_home),
                    **env,
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=5)  # (a daemon that does not stop at once is killed: it is a test's)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


@pytest.mark.spark
@pytest.mark.extended  # ~45 s (a standalone master and workers): make faults, not CI
def test_spark_healthchecks_against_a_real_master_and_workers(
    compose: dict[str, Any], spark_daemons: Any, tmp_path: Path
) -> None:
    """The compose probes, run against real daemons with the compose auth settings: healthy
    once up; a worker without the shared secret never registers, and its probe says so."""
    services = compose["services"]
    master_env = service_environment(services["spark-master"])
    worker_env = service_environment(services["spark-worker"])
    auth = {key: master_env[key] for key in ("_SPARK_AUTH_SECRET", "SPARK_DAEMON_JAVA_OPTS")}
    rpc, master_ui, worker_ui, stranger_ui = (_free_port() for _ in range(4))
    master_url = f"spark://127.0.0.1:{rpc}"
    common = ["--host", "127.0.0.1"]
    spark_daemons(
        SPARK_MASTER,
        [*common, "--port", str(rpc), "--webui-port", str(master_ui)],
        auth,
        "master",
    )
    master_probe = _local_probe(healthcheck_test(services["spark-master"]), 8080, master_ui)
    assert _probe_until(master_probe, 90) == 0
    # The UI listens on every interface, so the probe's 127.0.0.1 works in a container whose
    # master binds the service's name (--host spark-master).
    assert "Bound MasterWebUI to 0.0.0.0" in (tmp_path / "master.log").read_text()
    worker_probe = healthcheck_test(services["spark-worker"])
    spark_daemons(
        SPARK_WORKER,
        [*common, "--webui-port", str(worker_ui), master_url],
        {**auth, "SPARK_WORKER_DIR": str(tmp_path / "w1"), "SPARK_WORKER_CORES": "1"},
        "worker",
    )
    assert _probe_until(_local_probe(worker_probe, 8081, worker_ui), 90) == 0
    assert worker_env["_SPARK_AUTH_SECRET"] == auth["_SPARK_AUTH_SECRET"]
    # Without the secret the master turns the worker away: unhealthy, not silently idle.
    stranger = {
        "SPARK_DAEMON_JAVA_OPTS": auth["SPARK_DAEMON_JAVA_OPTS"],
        "_SPARK_AUTH_SECRET": "wrong",
    }
    spark_daemons(
        SPARK_WORKER,
        [*common, "--webui-port", str(stranger_ui), master_url],
        {**stranger, "SPARK_WORKER_DIR": str(tmp_path / "w2"), "SPARK_WORKER_CORES": "1"},
        "stranger",
    )
    stranger_probe = _local_probe(worker_probe, 8081, stranger_ui)
    time.sleep(15)
    assert _probe_until(stranger_probe, 0) != 0


# --------------------------------------------------------------------------- the checks can fail


def test_health_helpers_detect_broken_deployments(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    broken = copy.deepcopy(compose)
    services = broken["services"]
    del services["spark-master"]["healthcheck"]
    services["dagster-daemon"]["healthcheck"] = {"disable": True}
    services["dagster-webserver"]["depends_on"]["sluice-cli"]["condition"] = "service_started"
    assert sorted(health_problems(broken)) == [
        "dagster-daemon has no healthcheck",
        "dagster-daemon waits for spark-master with service_healthy, not service_started",
        "dagster-webserver waits for sluice-cli with service_started, not "
        "service_completed_successfully",
        "spark-master has no healthcheck",
        "spark-worker waits for spark-master with service_healthy, not service_started",
    ]
    services["spark-worker"]["healthcheck"]["test"] = [
        "CMD",
        "python",
        "-c",
        "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/json/'",
    ]
    services["dagster-webserver"]["healthcheck"]["test"] = ["CMD", "true"]
    services["postgres"]["healthcheck"] = {"test": ["CMD", "true"]}
    assert sorted(probe_problems(broken)) == [
        "dagster-daemon: healthcheck is not dagster-daemon liveness-check",
        "dagster-webserver: healthcheck does not ask /server_info on 3000",
        "postgres: healthcheck does not run pg_isready",
        "spark-master: healthcheck does not ask its UI on port 8080",
        "spark-worker: healthcheck does not ask its UI on port 8081",
        "spark-worker: healthcheck is not Python: '(' was never closed",
    ]
    services["dagster-daemon"]["hostname"] = "daemon"
    env = copy.deepcopy(environments)
    del env["sluice-cli"]["SLUICE_SPARK_DRIVER_HOST"]
    assert driver_problems(broken, env) == [
        "sluice-cli: SLUICE_SPARK_DRIVER_HOST is None, not 'sluice-cli'",
        "dagster-daemon: hostname is 'daemon', not 'dagster-daemon'",
    ]
    assert run_commands_without_aliases(
        "docker compose -f x.yml run --rm sluice-cli sluice run orders\n"
        "docker compose run --rm --use-aliases sluice-cli sluice run orders\n"
        "docker compose run --rm --name d -e SLUICE_SPARK_DRIVER_HOST=d sluice-cli sluice run o\n"
        "docker compose run --rm sluice-cli sluice status orders\n"
    ) == ["docker compose -f x.yml run --rm sluice-cli sluice run orders"]
