"""The compose deployment in ``docker/``, checked without a Docker engine.

Parses ``docker-compose.yml``, ``Dockerfile``, ``dagster.yaml``, ``workspace.yaml`` and
``.env.example`` and checks that every service, file, module, command, class and environment
variable they reference exists, and that Dagster accepts the instance and workspace files.
Each check is a helper returning a list of problems; the last test feeds the helpers broken
input to prove they catch it.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points, version
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from enumerator_service import ConfigError, Settings

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = DOCKER / "Dockerfile.dockerignore"
DAGSTER_YAML = DOCKER / "dagster.yaml"
WORKSPACE_YAML = DOCKER / "workspace.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"

#: Stand-ins for the values docker/.env.example leaves empty on purpose (passwords, secrets).
DUMMY_SECRETS = {
    "PLATFORM_POSTGRES_PASSWORD": "test-password",
    "DAGSTER_POSTGRES_PASSWORD": "test-password",
    "SLUICE_SPARK_AUTH_SECRET": "test-secret",
}

# --------------------------------------------------------------------------- parsing helpers

# $$ is an escaped dollar; ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error},
# ${NAME?error}, ${NAME:+alternative}, ${NAME+alternative} and $NAME are references.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariableError(Exception):
    """A ``${NAME:?…}`` / ``${NAME?…}`` reference whose variable is unset (or empty)."""


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """``value`` with compose-style variable references replaced from ``env``."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        op, arg = match["op"] or "", match["arg"] or ""
        current = env.get(name)
        present = current is not None and (current != "" or not op.startswith(":"))
        if op.endswith("-"):
            return current if present and current is not None else arg
        if op.endswith("?"):
            if not present or current is None:
                raise MissingVariableError(f"{name}: {arg or 'required'}")
            return current
        if op.endswith("+"):
            return arg if present else ""
        return current or ""

    return _VARIABLE.sub(replace, value)


def resolve(tree: Any, env: Mapping[str, str]) -> Any:
    """A copy of a parsed YAML tree with every string interpolated (as compose does)."""
    if isinstance(tree, str):
        return interpolate(tree, env)
    if isinstance(tree, list):
        return [resolve(item, env) for item in tree]
    if isinstance(tree, dict):
        return {key: resolve(item, env) for key, item in tree.items()}
    return tree


def strings(tree: Any) -> Iterator[str]:
    """Every string scalar of a parsed YAML tree."""
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, list):
        for item in tree:
            yield from strings(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from strings(item)


def variable_references(tree: Any) -> dict[str, str]:
    """Variables referenced in ``tree``: name -> operator ("" for a plain reference)."""
    found: dict[str, str] = {}
    for text in strings(tree):
        for match in _VARIABLE.finditer(text):
            name = match["braced"] or match["bare"]
            if name:
                op = match["op"] or ""
                # A required or defaulted use anywhere says more than a plain one.
                found[name] = op if op else found.get(name, "")
    return found


def parse_env_file(text: str) -> tuple[dict[str, str], set[str]]:
    """(variables set, variables only mentioned as ``# NAME=…``) of a .env file."""
    values: dict[str, str] = {}
    mentioned: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        commented = re.fullmatch(r"#\s*([A-Z_][A-Z0-9_]*)=.*", line)
        if commented:
            mentioned.add(commented[1])
            continue
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, f".env line without '=': {raw!r}"
        values[name.strip()] = value.strip()
    return values, mentioned


def service_environment(service: Mapping[str, Any]) -> dict[str, str]:
    """The ``environment`` of a compose service, list or mapping form, as a dict."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.partition("=") for item in env)
        return {name: value for name, _, value in pairs}
    return {str(name): "" if value is None else str(value) for name, value in env.items()}


def env_files(service: Mapping[str, Any]) -> list[str]:
    files = service.get("env_file") or []
    files = [files] if isinstance(files, str | dict) else files
    return [item["path"] if isinstance(item, dict) else item for item in files]


def container_environment(
    service: Mapping[str, Any], image_env: Mapping[str, str], dotenv: Mapping[str, str]
) -> dict[str, str]:
    """What a container of ``service`` sees: image ENV < env_file < environment."""
    env = dict(image_env)
    for name in env_files(service):
        assert (COMPOSE_FILE.parent / name).name == ".env", f"unexpected env_file {name}"
        env.update(dotenv)
    env.update(service_environment(service))
    return env


def command_of(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def volume_mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """Container path -> named volume (or host path) of a service."""
    mounts: dict[str, str] = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts[volume["target"]] = volume.get("source", "")
        else:
            source, _, rest = volume.partition(":")
            mounts[rest.split(":")[0]] = source
    return mounts


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, args = pending.strip().partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def copy_instructions(text: str) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD that copies from the build context."""
    copies = []
    for keyword, args in dockerfile_instructions(text):
        if keyword not in {"COPY", "ADD"}:
            continue
        parts = yaml.safe_load(args) if args.startswith("[") else shlex.split(args)
        if any(part.startswith("--from") for part in parts):
            continue
        parts = [part for part in parts if not part.startswith("--")]
        copies.append((parts[:-1], parts[-1]))
    return copies


def dockerfile_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in dockerfile_instructions(text):
        if keyword == "ENV":
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def dockerfile_workdir(text: str) -> str:
    workdirs = [args for keyword, args in dockerfile_instructions(text) if keyword == "WORKDIR"]
    assert workdirs, "the Dockerfile sets no WORKDIR"
    return workdirs[-1]


def dagster_env_refs(tree: Any) -> set[str]:
    """Names of ``{env: NAME}`` sources in a Dagster config tree."""
    found: set[str] = set()
    if isinstance(tree, dict):
        if set(tree) == {"env"} and isinstance(tree["env"], str):
            found.add(tree["env"])
        for item in tree.values():
            found |= dagster_env_refs(item)
    elif isinstance(tree, list):
        for item in tree:
            found |= dagster_env_refs(item)
    return found


def class_pointers(tree: Any) -> Iterator[tuple[str, str]]:
    """(module, class) of every configurable class in a Dagster config tree."""
    if isinstance(tree, dict):
        if isinstance(tree.get("module"), str) and isinstance(tree.get("class"), str):
            yield tree["module"], tree["class"]
        for item in tree.values():
            yield from class_pointers(item)
    elif isinstance(tree, list):
        for item in tree:
            yield from class_pointers(item)


# --------------------------------------------------------------------------- check helpers


def dependency_problems(compose: Mapping[str, Any]) -> list[str]:
    services = compose.get("services") or {}
    problems = []
    for name, service in services.items():
        depends = service.get("depends_on") or []
        for target in depends if isinstance(depends, list) else depends.keys():
            if target not in services:
                problems.append(f"{name} depends on undefined service {target!r}")
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for target, source in volume_mounts(service).items():
            named = source and not source.startswith((".", "/", "~"))
            if named and source not in declared:
                problems.append(f"{name} mounts undeclared volume {source!r} at {target}")
    return problems


def build_problems(compose: Mapping[str, Any], compose_dir: Path) -> list[str]:
    problems = []
    for name, service in (compose.get("services") or {}).items():
        build = service.get("build")
        if build is None:
            if "image" not in service:
                problems.append(f"{name} has neither build nor image")
            continue
        build = {"context": build} if isinstance(build, str) else build
        context = (compose_dir / build.get("context", ".")).resolve()
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        if not context.is_dir():
            problems.append(f"{name}: build context {context} does not exist")
        elif not dockerfile.is_file():
            problems.append(f"{name}: Dockerfile {dockerfile} does not exist")
    return problems


def copy_problems(dockerfile_text: str, context: Path, ignored: list[str]) -> list[str]:
    problems = []
    for sources, _ in copy_instructions(dockerfile_text):
        for source in sources:
            if not (context / source).exists():
                problems.append(f"COPY source {source} does not exist in {context}")
            path = PurePosixPath(source).as_posix().rstrip("/")
            for pattern in ignored:
                if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, f"{pattern}/*"):
                    problems.append(f"COPY source {source} is excluded by {pattern!r}")
    return problems


def missing_modules(modules: list[str]) -> list[str]:
    problems = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            problems.append(f"module {module} is not importable")
    return problems


def command_modules(command: list[str]) -> list[str]:
    """Modules named by ``-m`` / ``--module-name`` (python -m, dagster CLIs)."""
    return [
        command[i + 1]
        for i, arg in enumerate(command[:-1])
        if arg in {"-m", "--module-name"} and not command[i + 1].startswith("-")
    ]


def unknown_settings(names: set[str]) -> list[str]:
    fields = Settings.model_fields
    return sorted(
        f"{name} is not a Sluice setting"
        for name in names
        if name.startswith("SLUICE_") and name.removeprefix("SLUICE_").lower() not in fields
    )


def script_problems(names: set[str], declared: Mapping[str, str]) -> list[str]:
    """Console scripts the services run: installed with the target ``pyproject.toml`` declares,
    and that target (``module:function``) importable."""
    installed = {ep.name: ep for ep in entry_points(group="console_scripts")}
    problems = []
    for name in sorted(names):
        entry = installed.get(name)
        if entry is None:
            problems.append(f"console script {name} is not installed")
            continue
        if name in declared and entry.value != declared[name]:
            problems.append(f"{name} runs {entry.value}, pyproject.toml declares {declared[name]}")
        module, _, attribute = entry.value.partition(":")
        try:
            found = callable(getattr(importlib.import_module(module), attribute))
        except (ImportError, AttributeError):
            found = False
        if not found:
            problems.append(f"{name}: {entry.value} is not importable")
    return problems


def pipeline_problems(modules: str, copied: set[str]) -> list[str]:
    """``SLUICE_PIPELINES``: each module importable here, shipped in the image (its top-level
    package copied by the Dockerfile), and registering at least one pipeline."""
    from spark_jobs.pipeline._registry import load_pipelines

    settings = Settings(pipelines=modules)
    if not settings.pipeline_modules:
        return ["SLUICE_PIPELINES names no module"]
    problems = [
        f"{name}: package {name.split('.')[0]} is not copied into the image"
        for name in settings.pipeline_modules
        if name.split(".")[0] not in copied
    ]
    try:
        load_pipelines(settings)
    except ConfigError as exc:
        problems.append(str(exc))
    return problems


def undefined_variables(
    references: Mapping[str, str], dotenv: set[str], mentioned: set[str]
) -> list[str]:
    """Variables compose needs but .env.example neither sets nor documents."""
    problems = []
    for name, op in sorted(references.items()):
        if op.endswith("?") and name not in dotenv:
            problems.append(f"{name} is required but not set in .env.example")
        elif name not in dotenv | mentioned:
            problems.append(f"{name} is used but not listed in .env.example")
    return problems


def env_ref_problems(dagster_config: Any, environments: Mapping[str, set[str]]) -> list[str]:
    return [
        f"{service} does not provide {name} (dagster.yaml reads it)"
        for service, provided in sorted(environments.items())
        for name in sorted(dagster_env_refs(dagster_config) - provided)
    ]


def class_pointer_problems(dagster_config: Any) -> list[str]:
    problems = []
    for module, cls in class_pointers(dagster_config):
        try:
            found = hasattr(importlib.import_module(module), cls)
        except ImportError:
            found = False
        if not found:
            problems.append(f"class {module}.{cls} is not importable")
    return problems


def port_problems(compose: Mapping[str, Any]) -> list[str]:
    """Published ports (compose already interpolated) that are not bound to 127.0.0.1."""
    problems = []
    for name, service in (compose.get("services") or {}).items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                host_ip = port.get("host_ip", "")
            else:
                parts = str(port).split(":")
                host_ip = ":".join(parts[:-2]) if len(parts) >= 3 else ""
            if host_ip != "127.0.0.1":
                problems.append(f"{name} publishes {port!r} beyond 127.0.0.1")
    return problems


def spark_problems(compose: Mapping[str, Any], master_url: str) -> list[str]:
    """The Sluice master URL names a Master service, and every Worker points at it."""
    services = compose.get("services") or {}
    url = urlsplit(master_url)
    problems = []
    if url.scheme != "spark" or url.hostname not in services:
        return [f"{master_url} does not name a compose service"]
    master = command_of(services[url.hostname])
    if "org.apache.spark.deploy.master.Master" not in master:
        problems.append(f"service {url.hostname} does not run a Spark master")
    options = dict(itertools.pairwise(master))
    if options.get("--port", "7077") != str(url.port or 7077):
        problems.append(f"the master listens on {options.get('--port')}, not {url.port}")
    if options.get("--host", url.hostname) != url.hostname:
        problems.append(f"the master binds {options['--host']}, not {url.hostname}")
    workers = [
        (name, command_of(service))
        for name, service in services.items()
        if "org.apache.spark.deploy.worker.Worker" in command_of(service)
    ]
    if not workers:
        problems.append("no Spark worker service")
    for name, command in workers:
        targets = [arg for arg in command if arg.startswith("spark://")]
        if targets != [master_url]:
            problems.append(f"{name} connects to {targets}, not {master_url}")
        if url.hostname not in (services[name].get("depends_on") or {}):
            problems.append(f"{name} does not depend on {url.hostname}")
    return problems


def secret_problems(compose_raw: Mapping[str, Any]) -> list[str]:
    """Passwords in compose must come from variables, never be written into the file."""
    problems = []
    for name, service in (compose_raw.get("services") or {}).items():
        for key, raw in service_environment(service).items():
            # Each variable stands for itself: what is left of a password is written literally.
            marked = {ref: f"<{ref}>" for ref in variable_references(raw)}
            value = interpolate(raw, marked)
            if re.search("PASSWORD|SECRET|TOKEN", key) and value not in marked.values():
                problems.append(f"{name}: {key} is not a ${{VARIABLE}}")
            if re.match(r"^[a-z+]+://", value):
                password = urlsplit(value).password
                if password is not None and password not in marked.values():
                    problems.append(f"{name}: {key} holds a literal password")
    return problems


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def compose_raw() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def dotenv() -> tuple[dict[str, str], set[str]]:
    return parse_env_file(ENV_EXAMPLE.read_text())


@pytest.fixture(scope="module")
def interpolation_env(dotenv: tuple[dict[str, str], set[str]]) -> dict[str, str]:
    """docker/.env.example as a user fills it in (passwords set)."""
    values = {name: value for name, value in dotenv[0].items() if value}
    return {**values, **DUMMY_SECRETS}


@pytest.fixture(scope="module")
def compose(compose_raw: dict[str, Any], interpolation_env: dict[str, str]) -> dict[str, Any]:
    resolved = resolve(compose_raw, interpolation_env)
    assert isinstance(resolved, dict)
    return resolved


@pytest.fixture(scope="module")
def image_env() -> dict[str, str]:
    return dockerfile_env(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def environments(
    compose: dict[str, Any], image_env: dict[str, str], interpolation_env: dict[str, str]
) -> dict[str, dict[str, str]]:
    """Service -> environment of its containers (image ENV, env_file, environment)."""
    dotenv = {k: v for k, v in interpolation_env.items() if k not in DUMMY_SECRETS}
    return {
        name: container_environment(service, image_env if "build" in service else {}, dotenv)
        for name, service in compose["services"].items()
    }


@pytest.fixture(scope="module")
def dagster_config() -> dict[str, Any]:
    loaded = yaml.safe_load(DAGSTER_YAML.read_text())
    assert isinstance(loaded, dict)
    return loaded


def dagster_services(compose: Mapping[str, Any]) -> list[str]:
    return [
        name
        for name, service in compose["services"].items()
        if command_of(service)[:1] in (["dagster-webserver"], ["dagster-daemon"])
    ]


def sluice_services(compose: Mapping[str, Any]) -> list[str]:
    return [name for name, service in compose["services"].items() if "build" in service]


# --------------------------------------------------------------------------- compose


def test_compose_has_the_services_of_the_deployment(compose: dict[str, Any]) -> None:
    services = set(compose["services"])
    expected = {"postgres", "dagster-postgres", "spark-master", "spark-worker"}
    assert expected <= services
    assert sorted(command_of(compose["services"][n])[0] for n in dagster_services(compose)) == [
        "dagster-daemon",
        "dagster-webserver",
    ]
    for name in ("postgres", "dagster-postgres"):
        assert compose["services"][name].get("healthcheck"), f"{name} has no healthcheck"
        assert volume_mounts(compose["services"][name]), f"{name} keeps no data in a volume"


def test_dependencies_and_volumes_exist(compose: dict[str, Any]) -> None:
    assert dependency_problems(compose) == []


def test_build_contexts_and_dockerfiles_exist(compose: dict[str, Any]) -> None:
    assert build_problems(compose, COMPOSE_FILE.parent) == []
    builds = {
        (
            service["image"],
            (COMPOSE_FILE.parent / service["build"]["context"]).resolve(),
            service["build"]["dockerfile"],
        )
        for service in compose["services"].values()
        if "build" in service
    }
    # One image for every Sluice service (the Spark workers run the driver's Python).
    assert builds == {("sluice:local", REPO, "docker/Dockerfile")}


def test_published_ports_bind_to_localhost(compose: dict[str, Any]) -> None:
    assert port_problems(compose) == []
    assert any(s.get("ports") for s in compose["services"].values())


def test_no_password_is_written_into_compose(compose_raw: dict[str, Any]) -> None:
    assert secret_problems(compose_raw) == []


def test_every_variable_is_provided_by_env_example(
    compose_raw: dict[str, Any], dotenv: tuple[dict[str, str], set[str]]
) -> None:
    values, mentioned = dotenv
    references = variable_references(compose_raw)
    assert undefined_variables(references, set(values), mentioned) == []
    # Nothing stale in .env.example: each name is used by compose or is a Sluice setting
    # (the Sluice services read docker/.env as their env_file).
    listed = set(values) | mentioned
    stale = {n for n in listed - set(references) if not n.startswith("SLUICE_")}
    assert stale == set()
    assert unknown_settings(listed) == []
    # Secrets are never filled in: compose refuses to start until the user sets them.
    secrets = {n: values[n] for n in values if "PASSWORD" in n or "SECRET" in n}
    assert secrets == dict.fromkeys(DUMMY_SECRETS, "")
    with pytest.raises(MissingVariableError):
        resolve(compose_raw, {n: v for n, v in values.items() if v})


def test_sluice_variables_are_settings_and_validate(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    names = {name for env in environments.values() for name in env}
    names |= {name for s in compose["services"].values() for name in service_environment(s)}
    assert unknown_settings(names) == []
    for service in sluice_services(compose):
        env = environments[service]
        if not any(
            name.startswith("SLUICE_") for name in service_environment(compose["services"][service])
        ):
            continue  # Spark master/workers: tasks get their settings from the driver
        values = {
            name.removeprefix("SLUICE_").lower(): value
            for name, value in env.items()
            if name.startswith("SLUICE_")
        }
        settings = Settings(**values)  # a bad value raises here
        assert settings.database_url is not None, service
        url = urlsplit(settings.database_url.get_secret_value())
        assert url.hostname in compose["services"], f"{service}: {url.hostname} is no service"
        assert str(settings.data_dir) == "/data"


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_copies_existing_files() -> None:
    text = DOCKERFILE.read_text()
    ignored = [
        line.strip().lstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert copy_problems(text, REPO, ignored) == []
    sources = {source for sources, _ in copy_instructions(text) for source in sources}
    # Everything an editable install of the project needs: metadata, packages, migrations.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert {"pyproject.toml", pyproject["project"]["readme"], "sql"} | packages <= sources


def test_dockerfile_installs_the_deploy_extra_and_places_dagster_files() -> None:
    text = DOCKERFILE.read_text()
    runs = " ".join(args for keyword, args in dockerfile_instructions(text) if keyword == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert re.search(r"pip install -e '\.\[deploy\]'", runs)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # The library release of the pinned dagster: dagster 1.M.N <-> dagster-postgres 0.(M+16).N
    # (dagster-postgres itself requires dagster==1.M.N, so a mismatch would not install).
    (dagster_pin,) = [req for req in project["dependencies"] if req.startswith("dagster==")]
    (postgres_pin,) = [
        req for req in project["optional-dependencies"]["deploy"] if req.startswith("dagster-")
    ]
    major, minor, patch = dagster_pin.removeprefix("dagster==").split(".")
    assert major == "1"
    assert postgres_pin == f"dagster-postgres==0.{int(minor) + 16}.{patch}"
    assert version("dagster") == dagster_pin.removeprefix("dagster==")

    env = dockerfile_env(text)
    destinations = {PurePosixPath(dest): sources for sources, dest in copy_instructions(text)}
    assert destinations[PurePosixPath(env["DAGSTER_HOME"]) / "dagster.yaml"] == [
        "docker/dagster.yaml"
    ]
    assert env["PYSPARK_PYTHON"].startswith("/usr/local/bin/python")
    users = [args for keyword, args in dockerfile_instructions(text) if keyword == "USER"]
    assert users and users[-1] not in {"root", "0"}


# --------------------------------------------------------------------------- commands and modules


def test_commands_exist_and_accept_their_arguments(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    bin_dir = Path(sys.executable).parent
    scripts = {ep.name for ep in entry_points(group="console_scripts")}
    checks: list[tuple[str, list[str]]] = []
    for name in sluice_services(compose):
        command = command_of(compose["services"][name])
        assert command, f"{name} has no command"
        assert missing_modules(command_modules(command)) == []
        if command[0] in scripts:
            checks.append((name, command))
        else:  # spark-class: a script shipped by pyspark
            assert (bin_dir / command[0]).is_file(), f"{name}: {command[0]} not installed"
    # Options parse (an unknown option or subcommand exits 2) before --help exits 0.
    procs = [
        (
            name,
            subprocess.Popen(
                [str(bin_dir / command[0]), *command[1:], "--help"],
                # The container's SLUICE_* settings (the sluice CLI loads them first).
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
                    **{k: v for k, v in environments[name].items() if k.startswith("SLUICE_")},
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for name, command in checks
    ]
    results = [(name, proc.communicate(timeout=120)[1], proc.returncode) for name, proc in procs]
    assert [(name, err) for name, err, code in results if code != 0] == []
    assert {c[0] for _, c in checks} >= {"dagster-webserver", "dagster-daemon", "sluice"}
    # Each script runs the entry point the project declares (sluice: spark_jobs.cli:main).
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert declared["sluice"] == "spark_jobs.cli:main"
    assert script_problems({c[0] for _, c in checks}, declared) == []


def test_sluice_services_register_pipelines_the_image_ships(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    copied = {
        PurePosixPath(source).parts[0]
        for sources, _ in copy_instructions(DOCKERFILE.read_text())
        for source in sources
    }
    configured = {
        name: environments[name].get("SLUICE_PIPELINES", "")
        for name in sluice_services(compose)
        # Spark workers have the database URL for their tasks; the pipelines come from the driver.
        if "SLUICE_DATABASE_URL" in environments[name]
        and not any(
            arg.startswith("org.apache.spark.") for arg in command_of(compose["services"][name])
        )
    }
    assert set(configured) >= {"sluice-cli", "dagster-webserver", "dagster-daemon"}
    # The default: the three example pipeline modules (docker/.env may name the user's own modules).
    assert set(configured.values()) == {
        "examples.clickstream,examples.clickstream_iceberg,examples.orders"
    }
    for name, modules in configured.items():
        assert pipeline_problems(modules, copied) == [], name


def test_spark_classes_ship_with_pyspark(compose: dict[str, Any]) -> None:
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None
    jars = list((Path(spec.origin).parent / "jars").glob("spark-core_*.jar"))
    assert jars
    with zipfile.ZipFile(jars[0]) as jar:
        shipped = set(jar.namelist())
    classes = {
        arg
        for service in compose["services"].values()
        for arg in command_of(service)
        if arg.startswith("org.apache.spark.")
    }
    assert classes
    for cls in classes:
        assert cls.replace(".", "/") + ".class" in shipped, cls


def test_spark_workers_point_at_the_master(
    compose: dict[str, Any], environments: dict[str, dict[str, str]]
) -> None:
    masters = {
        env["SLUICE_SPARK_MASTER"] for env in environments.values() if "SLUICE_SPARK_MASTER" in env
    }
    (master_url,) = masters
    assert spark_problems(compose, master_url) == []


# Dagster 1.13 itself passes ``owners=[]`` when it binds resources to a sensor's job.
@pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)
def test_workspace_loads_an_importable_code_location(
    compose: dict[str, Any],
    environments: dict[str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dagster import Definitions
    from dagster._core.workspace.config_schema import ensure_workspace_config

    workspace = yaml.safe_load(WORKSPACE_YAML.read_text())
    ensure_workspace_config(workspace, str(WORKSPACE_YAML))
    targets = [entry["python_module"] for entry in workspace["load_from"]]
    assert [t["module_name"] for t in targets] == ["dagster_project.definitions"]
    assert missing_modules([t["module_name"] for t in targets]) == []
    # Loaded as the daemon loads it: with its environment (the registered pipelines and the
    # production resources).
    for name in [n for n in os.environ if n.startswith(("SLUICE_", "DAGSTER_"))]:
        monkeypatch.delenv(name)
    for name, value in environments["dagster-daemon"].items():
        monkeypatch.setenv(name, value)
    for target in targets:
        module = importlib.import_module(target["module_name"])
        loadable = getattr(module, target.get("attribute", "defs"))
        # A Definitions object, or a @dagster.definitions function that builds one on load.
        defs = loadable() if callable(loadable) else loadable
        assert isinstance(defs, Definitions)
        assert target["working_directory"] == dockerfile_workdir(DOCKERFILE.read_text())
        # Every pipeline the deployment registers is there: output asset, jobs, schedule.
        for pipeline in ("clickstream", "orders"):
            assert defs.resolve_assets_def(pipeline).key.to_user_string() == pipeline
            for job in (f"{pipeline}_incremental", f"{pipeline}_continuous"):
                assert defs.resolve_job_def(job).name == job
            assert defs.resolve_schedule_def(f"{pipeline}_schedule").job_name == (
                f"{pipeline}_incremental"
            )
    # The workspace file the Dagster services are given is the one the image copies.
    copied_to = {
        dest
        for sources, dest in copy_instructions(DOCKERFILE.read_text())
        if sources == ["docker/workspace.yaml"]
    }
    for name in dagster_services(compose):
        command = command_of(compose["services"][name])
        assert "-w" in command, f"{name} is not given the workspace"
        assert command[command.index("-w") + 1] in copied_to


# --------------------------------------------------------------------------- dagster.yaml


def test_dagster_yaml_is_a_valid_instance_config(
    dagster_config: dict[str, Any],
    compose: dict[str, Any],
    environments: dict[str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.storage.config import pg_config

    validated, custom_class = dagster_instance_config(str(DAGSTER_YAML.parent))
    assert custom_class is None
    assert set(validated["storage"]) == {"postgres"}
    assert validated["telemetry"] == {"enabled": False}
    assert class_pointer_problems(dagster_config) == []
    # The storage settings as the daemon resolves them from its environment.
    for name, value in environments["dagster-daemon"].items():
        monkeypatch.setenv(name, value)
    storage = process_config(pg_config(), dagster_config["storage"]["postgres"])
    assert storage.success, storage.errors
    assert storage.value is not None
    database = storage.value["postgres_db"]
    assert database["hostname"] == "dagster-postgres"
    assert database["password"] == DUMMY_SECRETS["DAGSTER_POSTGRES_PASSWORD"]
    assert (
        compose["services"]["dagster-postgres"]["environment"]["POSTGRES_DB"] == database["db_name"]
    )
    # storage: postgres loads dagster_postgres, shipped by the [deploy] extra (the test above
    # checks the pin); when it is installed here, its storage class must be there too.
    if importlib.util.find_spec("dagster_postgres") is not None:
        pointer = {"module": "dagster_postgres", "class": "DagsterPostgresStorage"}
        assert class_pointer_problems(pointer) == []


def test_dagster_yaml_run_queue_loads(dagster_config: dict[str, Any], tmp_path: Path) -> None:
    """The instance with SQLite storage instead of Postgres: coordinator, limits, launcher."""
    from dagster import DagsterInstance, DefaultRunLauncher, QueuedRunCoordinator

    local = {**copy.deepcopy(dagster_config), "storage": {"sqlite": {"base_dir": str(tmp_path)}}}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(local))
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert isinstance(instance.run_launcher, DefaultRunLauncher)
        queue = instance.get_concurrency_config().run_queue_config
        assert queue is not None
        assert queue.max_concurrent_runs > 0
        limits = {
            (limit["key"], str(limit.get("value"))): limit["limit"]
            for limit in queue.tag_concurrency_limits
        }
        # One continuous run per pipeline (the tag's value is the pipeline's name).
        assert limits[("sluice/continuous", "{'applyLimitPerUniqueValue': True}")] == 1


def test_dagster_services_get_what_dagster_yaml_reads(
    compose: dict[str, Any],
    dagster_config: dict[str, Any],
    environments: dict[str, dict[str, str]],
) -> None:
    names = dagster_services(compose)
    assert len(names) == 2
    provided = {name: set(environments[name]) for name in names}
    assert env_ref_problems(dagster_config, provided) == []
    assert dagster_env_refs(dagster_config) >= {"DAGSTER_POSTGRES_PASSWORD"}
    # The instance storage host is the dagster-postgres service (by default).
    for name in names:
        env = environments[name]
        assert env["DAGSTER_POSTGRES_HOSTNAME"] in compose["services"]
        int(env["DAGSTER_POSTGRES_PORT"])
        home = PurePosixPath(env["DAGSTER_HOME"])
        # Webserver and daemon share compute logs and data through the same named volumes.
        mounts = volume_mounts(compose["services"][name])
        assert mounts.get(str(home / "storage")) == "dagster-storage", name
        assert mounts.get(env["SLUICE_DATA_DIR"]) == "sluice-data", name
    for name, service in compose["services"].items():
        if "org.apache.spark.deploy.worker.Worker" in command_of(service):
            assert volume_mounts(service).get("/data") == "sluice-data", name


# --------------------------------------------------------------------------- the checks can fail


def test_helpers_detect_broken_references(compose: dict[str, Any]) -> None:
    assert interpolate("${A:-x}/${B-y}/${C:+z}/$$D/$E", {"A": "", "B": "", "C": "1"}) == "x//z/$D/"
    with pytest.raises(MissingVariableError):
        interpolate("${PASSWORD:?set it}", {"PASSWORD": ""})

    broken = copy.deepcopy(compose)
    broken["services"]["dagster-daemon"]["depends_on"]["no-such-service"] = {}
    broken["services"]["spark-worker"]["volumes"].append("no-such-volume:/x")
    assert len(dependency_problems(broken)) == 2

    broken["services"]["spark-worker"]["build"]["dockerfile"] = "docker/Nope.Dockerfile"
    assert build_problems(broken, COMPOSE_FILE.parent)

    # "sql" is in every checkout (unlike data/, which only exists after `make demo`).
    assert copy_problems("COPY no-such-file.txt /x\nCOPY sql /d", REPO, ["sql"]) == [
        "COPY source no-such-file.txt does not exist in " + str(REPO),
        "COPY source sql is excluded by 'sql'",
    ]
    assert missing_modules(["dagster_project.nope", "no_such_package.definitions"]) == [
        "module dagster_project.nope is not importable",
        "module no_such_package.definitions is not importable",
    ]
    assert command_modules(["dagster", "dev", "-m", "nope.defs"]) == ["nope.defs"]
    assert script_problems({"no-such-script"}, {}) == [
        "console script no-such-script is not installed"
    ]
    assert script_problems({"sluice"}, {"sluice": "enumerator_service.cli:main"}) == [
        "sluice runs spark_jobs.cli:main, pyproject.toml declares enumerator_service.cli:main"
    ]
    assert pipeline_problems("examples.nope", {"examples"}) == [
        "SLUICE_PIPELINES: no module named 'examples.nope'"
    ]
    assert pipeline_problems("examples.clickstream", set()) == [
        "examples.clickstream: package examples is not copied into the image"
    ]
    assert pipeline_problems("", {"examples"}) == ["SLUICE_PIPELINES names no module"]
    assert unknown_settings({"SLUICE_NO_SUCH_SETTING", "SLUICE_PARALLELISM", "OTHER"}) == [
        "SLUICE_NO_SUCH_SETTING is not a Sluice setting"
    ]
    references = variable_references({"a": "${NEEDED:?x} ${OPTIONAL:-1} $$ESCAPED"})
    assert references == {"NEEDED": ":?", "OPTIONAL": ":-"}
    assert undefined_variables(references, set(), set()) == [
        "NEEDED is required but not set in .env.example",
        "OPTIONAL is used but not listed in .env.example",
    ]
    assert env_ref_problems({"x": {"env": "NOPE"}}, {"dagster-daemon": set()}) == [
        "dagster-daemon does not provide NOPE (dagster.yaml reads it)"
    ]
    # The module path most examples still use is gone from dagster 1.13.
    old_pointer = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}
    assert class_pointer_problems(old_pointer)

    exposed = {"services": {"ui": {"ports": ["3000:3000", "0.0.0.0:8080:8080", "127.0.0.1:1:1"]}}}
    assert len(port_problems(exposed)) == 2

    broken["services"]["spark-worker"]["command"][-1] = "spark://elsewhere:7077"
    assert spark_problems(broken, "spark://spark-master:7077") == [
        "spark-worker connects to ['spark://elsewhere:7077'], not spark://spark-master:7077"
    ]
    assert spark_problems(broken, "spark://no-such-host:7077")

    leaky = {
        "services": {
            "db": {
                "environment": {
                    "POSTGRES_PASSWORD": "hunter2",
                    "SLUICE_DATABASE_URL": "postgresql://u:hunter2@db/x",
                }
            }
        }
    }
    assert len(secret_problems(leaky)) == 2
