"""The production deployment: ``docker-compose.yml``, ``docker/*.Dockerfile`` and what the
containers run.

No Docker engine is needed. The compose file is validated and normalised by
``docker-compose config`` (Debian's ``docker-compose`` package, Compose 1.29; the tests
skip with a message when the binary is absent), with every profile enabled, and the
result is checked: services, profiles, health checks, GPU reservations, migrations
before the API and workers, secrets as files, builds and Dockerfiles, queues, volumes.

Then the containers' own command lines (compose ``command``, Dockerfile ``CMD``, health
checks) are resolved against this repository (modules, factories, Celery app and
queues, ``keyseed`` sub-commands, options) and, where it can be done on this machine,
run natively through ``docker/entrypoint.sh`` with the services' environment: the
migration against Postgres, the API and its health check, a CPU worker and its health
check against Redis, the packaged local LLM and its health check.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import typing
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from dotenv import dotenv_values
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKER_DIR = REPO / "docker"
ENTRYPOINT = DOCKER_DIR / "entrypoint.sh"
INIT_SECRETS = DOCKER_DIR / "init-secrets.sh"
DOCKERFILES = {
    image: (DOCKER_DIR / f"{image}.Dockerfile").resolve()
    for image in ("api", "worker-cpu", "worker-gpu")
}
ENV_EXAMPLE = DOCKER_DIR / "env.example"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
VENV_BIN = Path(sys.executable).parent

PROFILES = ("gpu", "vllm")
SERVICES = {
    "postgres",
    "redis",
    "migrate",
    "api",
    "worker-cpu",
    "worker-gpu",
    "local-llm",
    "vllm",
    "flower",
}
PROFILED = {"worker-gpu": ["gpu"], "vllm": ["vllm"]}
HEALTHCHECKED = SERVICES - {"migrate"}
WORKERS = ("worker-cpu", "worker-gpu")
NEEDS_MIGRATIONS = ("api", "worker-cpu", "worker-gpu")
GPU_SERVICES = ("worker-gpu", "vllm")
SECRETS_MOUNT = "/run/secrets/"
CONTAINER_PATHS = ("/var/", "/home/", "/run/", "/tmp/")  # moved under a temporary root
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|(^|_)KEY$|API_KEY|BASIC_AUTH")

POSTGRES_SERVER = os.environ.get(
    "KEYSEED_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_SERVER = os.environ.get("KEYSEED_TEST_REDIS", "redis://127.0.0.1:6379")


# --------------------------------------------------------------------------- helpers


def docker_compose() -> str:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip(
            "docker-compose is not installed: `apt-get install -y docker-compose` "
            "(Debian's Compose 1.29; no Docker engine needed) to validate docker-compose.yml"
        )
    return binary


def compose_config(env_file: Path) -> dict[str, Any]:
    """``docker-compose config`` of the file with every profile, as a dict."""
    command = [
        docker_compose(),
        "--file",
        str(COMPOSE_FILE),
        "--project-directory",
        str(REPO),
        "--env-file",
        str(env_file),
    ]
    for profile in PROFILES:
        command += ["--profile", profile]
    # Only what the file is given here: no DATABASE_URL & co. leaking in from the caller.
    environment = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    result = subprocess.run(
        [*command, "config"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    config = yaml.safe_load(result.stdout)
    assert isinstance(config, dict)
    return config


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The configuration with the defaults: an empty .env, every profile."""
    env_file = tmp_path_factory.mktemp("compose") / "empty.env"
    env_file.write_text("", encoding="utf-8")
    return compose_config(env_file)


@pytest.fixture(scope="module")
def services(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(config["services"])


def environment_of(service: dict[str, Any]) -> dict[str, str | None]:
    """A service's environment as a mapping (Compose allows a list of KEY=VALUE too)."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs: dict[str, str | None] = {}
        for item in raw:
            key, sep, value = str(item).partition("=")
            pairs[key] = value if sep else None
        return pairs
    return {k: None if v is None else str(v) for k, v in raw.items()}


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in raw.items()}


def secret_names(service: dict[str, Any]) -> set[str]:
    return {s if isinstance(s, str) else s["source"] for s in service.get("secrets") or []}


def secret_targets(service: dict[str, Any]) -> set[str]:
    targets = set()
    for item in service.get("secrets") or []:
        if isinstance(item, str):
            targets.add(SECRETS_MOUNT + item)
        else:
            target = item.get("target") or item["source"]
            targets.add(target if target.startswith("/") else SECRETS_MOUNT + target)
    return targets


def healthcheck_test(service: dict[str, Any]) -> list[str]:
    check = service.get("healthcheck") or {}
    assert not check.get("disable"), "health check disabled"
    test = check.get("test")
    if isinstance(test, str):
        return ["CMD-SHELL", test]
    return list(test or [])


def ours(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run an image built from this repository."""
    return {name: s for name, s in services.items() if "build" in s}


def option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def queues_of(argv: list[str]) -> set[str]:
    value = option(argv, "--queues", "-Q")
    assert value, f"a worker must name its queues: {argv}"
    return set(value.split(","))


def python_snippet(argv: list[str]) -> str | None:
    """The code of ``python -c CODE`` (or python3), else None."""
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1] == "-c":
        return argv[2]
    return None


# --------------------------------------------------------------------------- Dockerfiles


@dataclass
class Stage:
    name: str | None
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for rest in self.all("ENV"):
            words = shlex.split(rest)
            if words and "=" not in words[0]:
                values[words[0]] = " ".join(words[1:])
                continue
            for word in words:
                key, _, value = word.partition("=")
                values[key] = value
        return values


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_args(self) -> dict[str, str]:
        values = dict(self.args)
        for stage in self.stages:
            for rest in stage.all("ARG"):
                name, _, default = rest.partition("=")
                values.setdefault(name.strip(), default.strip().strip('"'))
        return values

    def exec_form(self, keyword: str) -> list[str]:
        rest = self.final.last(keyword)
        assert rest is not None, f"{self.path.name} has no {keyword}"
        value = json.loads(rest)
        assert isinstance(value, list), f"{self.path.name}: {keyword} must be exec form"
        return [str(v) for v in value]


def parse_dockerfile(path: Path) -> Dockerfile:
    lines: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m[1] or m[2]], words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name, base))
        elif not stages:
            assert keyword == "ARG", f"{path.name}: only ARG may precede FROM"
            name, _, default = rest.partition("=")
            global_args[name.strip()] = default.strip()
        else:
            stages[-1].instructions.append((keyword, rest))
    assert stages, f"{path.name} has no FROM"
    return Dockerfile(path, global_args, stages)


def dockerfiles(services: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """Every Dockerfile the compose file builds, by service."""
    found = {}
    for name, service in ours(services).items():
        build = service["build"]
        context = Path(build["context"] if isinstance(build, dict) else build).resolve()
        # the Dockerfiles COPY paths of the repository root
        assert context == REPO, f"{name}: the build context must be the repository root"
        found[name] = (context / build.get("dockerfile", "Dockerfile")).resolve()
    return found


# ---------------------------------------------------------------------- .dockerignore


def dockerignore_patterns() -> list[str]:
    patterns = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            patterns.append(line.rstrip("/"))
    return patterns


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``relative`` out of the context (no negations are used)."""
    parts = Path(relative).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        for candidate in candidates:
            if fnmatch.fnmatchcase(candidate, pattern):
                return True
            if pattern.startswith("**/") and (
                fnmatch.fnmatchcase(candidate, pattern[3:])
                or fnmatch.fnmatchcase(candidate.split("/")[-1], pattern[3:])
            ):
                return True
    return False


# =========================================================================== compose


def test_config_validates_with_every_service(config: dict[str, Any]) -> None:
    assert set(config["services"]) == SERVICES


def test_profiles(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert list(service.get("profiles") or []) == PROFILED.get(name, []), name


def test_health_checks(services: dict[str, dict[str, Any]]) -> None:
    for name in HEALTHCHECKED:
        test = healthcheck_test(services[name])
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"
        code = python_snippet(test[1:]) if test[0] == "CMD" else None
        if code is not None:
            compile(code, f"<{name} health check>", "exec")
    assert "pg_isready" in " ".join(healthcheck_test(services["postgres"]))
    assert "ping" in healthcheck_test(services["redis"])
    assert "/readyz" in " ".join(healthcheck_test(services["api"]))
    assert "/v1/models" in " ".join(healthcheck_test(services["local-llm"]))
    for name in WORKERS:
        check = " ".join(healthcheck_test(services[name]))
        node = option(services[name]["command"], "--hostname", "-n")
        assert node is not None
        # the worker pings itself: the destination is its own node name
        assert "inspect ping" in check
        assert node.replace("%h", "$$HOSTNAME") in check


def test_gpu_services_reserve_an_nvidia_device(services: dict[str, dict[str, Any]]) -> None:
    for name in GPU_SERVICES:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(
            d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices
        ), name
    assert not any("deploy" in services[n] for n in ("worker-cpu", "api", "local-llm"))


def test_migrations_run_once_before_the_api_and_workers(
    services: dict[str, dict[str, Any]],
) -> None:
    migrate = services["migrate"]
    assert migrate["command"] == ["keyseed", "admin", "migrate"]
    assert str(migrate.get("restart", "no")) == "no"
    assert depends_on(migrate)["postgres"] == "service_healthy"
    for name in NEEDS_MIGRATIONS:
        assert depends_on(services[name]).get("migrate") == "service_completed_successfully", name
    # nothing else reaches the database without waiting for the migration
    for name, service in ours(services).items():
        if name != "migrate" and "POSTGRES_HOST" in environment_of(service):
            assert name in NEEDS_MIGRATIONS, name
    assert depends_on(services["api"])["redis"] == "service_healthy"


def test_secrets_are_files_never_values(services: dict[str, dict[str, Any]], config: Any) -> None:
    declared = config["secrets"]
    assert {"data_key", "postgres_password", "openai_api_key"} <= set(declared)
    for name, secret in declared.items():
        assert set(secret) == {"file"}, f"secret {name} must come from a file: {secret}"
        relative = Path(secret["file"]).resolve().relative_to(REPO).as_posix()
        assert ignored(relative, dockerignore_patterns()), f"{relative} is in the build context"
    for name, service in services.items():
        assert secret_names(service) <= set(declared), name
        mounted = secret_targets(service)
        for key, value in environment_of(service).items():
            if value and value.startswith(SECRETS_MOUNT):
                assert key.endswith("_FILE"), (name, key)
                assert value in mounted, f"{name}: {key}={value} is not mounted"
            elif SECRET_NAME.search(key) and not key.endswith("_FILE"):
                assert not value, f"{name}: {key} holds a secret value inline"
            if key.endswith("_URL") and value:
                assert make_url(value).password is None, f"{name}: password in {key}"
    for name in ("api", "worker-cpu", "worker-gpu"):
        env = environment_of(services[name])
        assert env["KEYSEED_DATA_KEY_FILE"] == SECRETS_MOUNT + "data_key"
        assert env["POSTGRES_PASSWORD_FILE"] == SECRETS_MOUNT + "postgres_password"
    assert environment_of(services["postgres"])["POSTGRES_PASSWORD_FILE"] == (
        SECRETS_MOUNT + "postgres_password"
    )


def test_every_build_names_an_existing_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    files = dockerfiles(services)
    assert set(files) == {"migrate", "api", "worker-cpu", "worker-gpu", "local-llm"}
    for name, path in files.items():
        assert path.is_file(), f"{name}: {path} does not exist"
    assert set(files.values()) == set(DOCKERFILES.values())
    assert files["migrate"] == files["api"] and files["local-llm"] == files["worker-cpu"]
    by_image: dict[str, set[Path]] = {}
    for name, path in files.items():
        by_image.setdefault(services[name]["image"], set()).add(path)
    for image, paths in by_image.items():
        assert len(paths) == 1, f"{image} is built from {paths}"


def test_every_queue_has_a_worker(services: dict[str, dict[str, Any]]) -> None:
    from app.config import Settings
    from app.worker import QUEUES, RUN_PROMPTS, task_routes

    consumed = {name: queues_of(services[name]["command"]) for name in WORKERS}
    assert consumed == {"worker-cpu": {"cpu", "llm"}, "worker-gpu": {"gpu"}}
    assert set().union(*consumed.values()) == set(QUEUES)
    # without a profile: the default sequences queue and the prompting queue are served
    default_queue = Settings.model_fields["sequences_queue"].default
    routes = task_routes(Settings(sequences_queue=default_queue))
    assert routes[RUN_PROMPTS]["queue"] in consumed["worker-cpu"]
    assert default_queue in consumed["worker-cpu"]
    # every value KEYSEED_SEQUENCES_QUEUE may take has a worker
    allowed = typing.get_args(Settings.model_fields["sequences_queue"].annotation)
    assert set(allowed) <= set().union(*consumed.values())


def test_workers_share_the_cache_volume(services: dict[str, dict[str, Any]]) -> None:
    volumes = set()
    for name in WORKERS:
        cache = environment_of(services[name])["KEYSEED_CACHE_DIR"]
        mounts = [
            v
            for v in services[name].get("volumes", [])
            if (v["target"] if isinstance(v, dict) else v.split(":")[1]) == cache
        ]
        assert len(mounts) == 1, f"{name} does not mount a volume at {cache}"
        mount = mounts[0]
        volumes.add(mount["source"] if isinstance(mount, dict) else mount.split(":")[0])
    assert len(volumes) == 1


def test_data_stores_stay_on_the_internal_network(
    services: dict[str, dict[str, Any]], config: Any
) -> None:
    assert config["networks"]["backend"].get("internal") is True
    for name in ("postgres", "redis", "local-llm", "worker-gpu", "migrate"):
        assert not services[name].get("ports"), name
        assert set(services[name]["networks"]) == {"backend"}, name
    published = {n for n, s in services.items() if s.get("ports")}
    assert published == {"api", "flower"}


def test_flower_watches_the_broker_the_app_uses(services: dict[str, dict[str, Any]]) -> None:
    flower = environment_of(services["flower"])
    assert flower["CELERY_BROKER_URL"] == environment_of(services["api"])["REDIS_URL"]
    assert services["flower"]["command"][:2] == ["celery", "flower"]
    assert depends_on(services["flower"])["redis"] == "service_healthy"
    for name in WORKERS:  # Flower shows tasks only when workers send events
        assert {"-E", "--task-events"} & set(services[name]["command"]), name


def test_env_example_and_endpoint_registration(tmp_path: Path) -> None:
    from app.config import Settings

    example_text = ENV_EXAMPLE.read_text(encoding="utf-8")
    compose_text = COMPOSE_FILE.read_text(encoding="utf-8")
    uncommented = "\n".join(
        re.sub(r"^# (?=[A-Z][A-Z0-9_]*=)", "", line) for line in example_text.splitlines()
    )
    examples = [
        line for line in uncommented.splitlines() if line.startswith("KEYSEED_LLM_ENDPOINTS=")
    ]
    assert len(examples) >= 3
    variables = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", uncommented, re.MULTILINE))
    for variable in variables:  # every documented variable is one the compose file reads
        assert re.search(rf"\$\{{{variable}[:}}]|^\s+{variable}:\s*$", compose_text, re.M), variable
    vllm_model = re.search(r"\$\{VLLM_MODEL:-([^}]+)\}", compose_text)
    assert vllm_model is not None
    for example in examples:
        env_file = tmp_path / "one.env"
        env_file.write_text(example + "\nKEYSEED_SEQUENCES_QUEUE=gpu\n", encoding="utf-8")
        value = dotenv_values(env_file)["KEYSEED_LLM_ENDPOINTS"]
        assert value is not None
        endpoints = Settings(llm_endpoints=json.loads(value)).llm_endpoints
        for name, endpoint in endpoints.items():
            assert not endpoint.api_key.get_secret_value(), f"{name}: inline key"
            if endpoint.api_key_file is not None:
                assert str(endpoint.api_key_file).startswith(SECRETS_MOUNT)
            if name == "vllm":
                assert endpoint.base_url == "http://vllm:8000/v1"
                assert endpoint.model == vllm_model[1]
        # the value reaches the API and the workers unchanged through `docker-compose config`
        services = compose_config(env_file)["services"]
        for name in ("api", "worker-cpu", "worker-gpu"):
            env = environment_of(services[name])
            assert env["KEYSEED_LLM_ENDPOINTS"] == value, name
            assert env["KEYSEED_SEQUENCES_QUEUE"] == "gpu", name
        mounted = secret_targets(services["worker-cpu"])
        for endpoint in endpoints.values():
            if endpoint.api_key_file is not None:
                assert str(endpoint.api_key_file) in mounted


# =========================================================================== Dockerfiles


@pytest.fixture(scope="module")
def parsed() -> dict[str, Dockerfile]:
    """The three Dockerfiles by image: api, worker-cpu, worker-gpu."""
    return {image: parse_dockerfile(path) for image, path in DOCKERFILES.items()}


def image_of(
    services: dict[str, dict[str, Any]], name: str, parsed: dict[str, Dockerfile]
) -> Dockerfile:
    """The Dockerfile service ``name`` is built from."""
    path = dockerfiles(services)[name]
    (image,) = [image for image, known in DOCKERFILES.items() if known == path]
    return parsed[image]


def test_dockerfiles_build_a_non_root_offline_image(parsed: dict[str, Dockerfile]) -> None:
    for name, dockerfile in parsed.items():
        final = dockerfile.final
        user = final.last("USER")
        assert user is not None and user.split(":")[0] not in ("root", "0"), name
        env = final.env()
        assert env.get("HF_HUB_OFFLINE") == "1", name
        assert env.get("KEYSEED_CACHE_DIR"), name
        assert dockerfile.exec_form("ENTRYPOINT") == ["keyseed-entrypoint"], name
        copies = [c.split() for c in final.all("COPY")]
        assert ["docker/entrypoint.sh", "/usr/local/bin/keyseed-entrypoint"] in copies, name
        assert len(dockerfile.stages) >= 2, f"{name}: build tools belong in a builder stage"
        stage_names = {s.name for s in dockerfile.stages}
        for stage in dockerfile.stages:
            for rest in stage.all("COPY"):
                words = rest.split()
                source = [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
                assert all(s in stage_names for s in source), (name, rest)


def test_dockerfiles_copy_only_what_exists_in_the_context(parsed: dict[str, Dockerfile]) -> None:
    patterns = dockerignore_patterns()
    assert not any(p.startswith("!") for p in patterns)
    for name, dockerfile in parsed.items():
        for stage in dockerfile.stages:
            for rest in stage.all("COPY"):
                words = [w for w in rest.split() if not w.startswith("--")]
                if any(w.startswith("--from=") for w in rest.split()):
                    continue
                for source in words[:-1]:
                    assert (REPO / source).exists(), f"{name}: COPY {source}: no such path"
                    assert not ignored(source, patterns), f"{name}: {source} is .dockerignored"
    for kept in (".git", ".venv", "secrets", ".env", "tests", "var"):
        assert ignored(kept, patterns), f".dockerignore must exclude {kept}"


def test_dockerfiles_install_the_pinned_torch_and_python(parsed: dict[str, Dockerfile]) -> None:
    pins = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch==")]
    assert len(pins) == 1
    pinned = pins[0].split(";")[0].split("#")[0].strip().removeprefix("torch==")
    python = re.search(r"(\d+\.\d+)", PYPROJECT["project"]["requires-python"])
    assert python is not None
    for name, dockerfile in parsed.items():
        args = dockerfile.stage_args()
        assert args["TORCH_VERSION"] == pinned, name
        runs = " ".join(" ".join(s.all("RUN")) for s in dockerfile.stages)
        assert '"torch==${TORCH_VERSION}${TORCH_VARIANT}"' in runs, name
        if name == "worker-gpu":
            continue
        assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu", name
        assert args["TORCH_VARIANT"] == "+cpu", name
        assert dockerfile.final.base == f"python:{python[1]}-slim-bookworm", name
    gpu = parsed["worker-gpu"]
    base = gpu.stages[0]
    assert base.base.startswith("nvidia/cuda:") and "-runtime-" in base.base
    assert f"python{python[1]}" in " ".join(base.all("RUN"))
    assert f"python{python[1]} -m venv" in " ".join(" ".join(s.all("RUN")) for s in gpu.stages)
    assert all(stage.base in ("python", base.base) for stage in gpu.stages)
    assert gpu.final.env().get("KEYSEED_DEVICE") == "cuda"


# ================================================================ the containers' commands


def check_command(argv: list[str], where: str) -> None:
    """``argv`` names a program and modules, factories, sub-commands that exist here."""
    program = argv[0]
    scripts = {e.name for e in importlib.metadata.entry_points(group="console_scripts")}
    if program in ("uvicorn", "celery", "keyseed"):
        assert program in scripts, f"{where}: no console script {program}"
    if program == "uvicorn":
        uvicorn_main = importlib.import_module("uvicorn.main")
        assert "--factory" in argv, where
        target = next(a for a in argv[1:] if ":" in a and not a.startswith("-"))
        module, _, attribute = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), where
        known = {o for p in uvicorn_main.main.params for o in getattr(p, "opts", [])}
        for arg in argv[1:]:
            if arg.startswith("--"):
                assert arg.split("=")[0] in known, f"{where}: uvicorn has no {arg}"
    elif program == "celery":
        from celery.app.utils import find_app

        from app.worker import QUEUES, celery_app

        assert option(argv, "-A", "--app") == "app.worker", where
        assert find_app("app.worker") is celery_app, where
        if "worker" in argv:
            assert queues_of(argv) <= set(QUEUES), where
        # Celery parses the options (an unknown one fails) before --help exits
        result = subprocess.run(
            [str(VENV_BIN / "celery"), *argv[1:], "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{where}: {result.stderr}"
    elif program == "keyseed":
        from app.cli import build_parser

        args = build_parser().parse_args(argv[1:])
        module, _, function = args.handler.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), where
    elif python_snippet(argv) is not None:
        compile(str(python_snippet(argv)), where, "exec")
    elif Path(program).name.startswith("python") and argv[1] == "-m":
        module = argv[2]
        assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{where}: {result.stderr}"
        for arg in argv[3:]:
            if arg.startswith("--"):
                assert arg.split("=")[0] in result.stdout, f"{where}: {module} has no {arg}"
    else:
        raise AssertionError(f"{where}: unexpected program {program!r}")


def test_dockerfile_commands_exist_in_this_repository(parsed: dict[str, Dockerfile]) -> None:
    for dockerfile in parsed.values():
        check_command(dockerfile.exec_form("CMD"), f"{dockerfile.path.name} CMD")
    assert ENTRYPOINT.is_file() and os.access(ENTRYPOINT, os.X_OK)
    assert subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=False).returncode == 0


def test_compose_commands_exist_in_this_repository(services: dict[str, dict[str, Any]]) -> None:
    for name, service in ours(services).items():
        check_command([str(a) for a in service["command"]], f"{name} command")
        test = healthcheck_test(service) if name != "migrate" else []
        if test:
            argv = test[1:] if test[0] == "CMD" else shlex.split(test[1].replace("$$", "$"))
            check_command(argv, f"{name} health check")


def test_image_commands_match_compose(
    services: dict[str, dict[str, Any]], parsed: dict[str, Dockerfile]
) -> None:
    """``docker run`` of an image does what its compose service does."""
    for name in ("api", "worker-gpu"):
        assert parsed[name].exec_form("CMD") == services[name]["command"], name
    cpu = parsed["worker-cpu"].exec_form("CMD")
    assert queues_of(cpu) == queues_of(services["worker-cpu"]["command"])


def test_celery_report_uses_the_compose_broker(services: dict[str, dict[str, Any]]) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    env["REDIS_URL"] = str(environment_of(services["worker-cpu"])["REDIS_URL"])
    result = subprocess.run(
        [str(VENV_BIN / "celery"), "-A", "app.worker", "report"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # the report masks the (empty) password: redis://:********@redis:6379/0
    assert "transport:redis" in result.stdout
    assert "@redis:6379/0'" in result.stdout


# ========================================================== entry point and secrets, natively


def run_entrypoint(
    env: dict[str, str], *command: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *command],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd or tempfile.gettempdir(),
        timeout=180,
        check=False,
    )


SETTINGS_PROBE = (
    "import json; from app.config import Settings; s = Settings(); "
    "print(json.dumps({'db': s.sqlalchemy_url, 'broker': s.celery_broker_url, "
    "'cache': str(s.cache_dir), 'endpoints': sorted(s.llm_endpoints), "
    "'queue': s.sequences_queue, 'device': s.device, 'local': s.local_llm_url, "
    "'key': len(s.document_key())}))"
)


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "secrets"
    result = subprocess.run(
        ["sh", str(INIT_SECRETS), str(directory)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return directory


def test_init_secrets_makes_readable_files_in_a_private_directory(secrets_dir: Path) -> None:
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    made = {p.name: p for p in secrets_dir.iterdir()}
    assert set(made) == {"data_key", "postgres_password", "openai_api_key", "azure_openai_api_key"}
    for path in made.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert len(base64.b64decode(made["data_key"].read_text(), validate=True)) == 32
    assert len(made["postgres_password"].read_text()) >= 40
    before = made["data_key"].read_text()
    result = subprocess.run(["sh", str(INIT_SECRETS), str(secrets_dir)], capture_output=True)
    assert result.returncode == 0 and made["data_key"].read_text() == before


def native_env(
    service: dict[str, Any], dockerfile: Dockerfile, root: Path, secrets: Path
) -> dict[str, str]:
    """The container's environment (image ENV, then compose's), with its paths moved
    under ``root`` and /run/secrets/ pointing at ``secrets``."""
    env: dict[str, str] = {}
    merged: dict[str, str | None] = {**dockerfile.final.env(), **environment_of(service)}
    for key, value in merged.items():
        if value is None or key == "PATH":
            continue
        if value.startswith(SECRETS_MOUNT):
            value = str(secrets / value.removeprefix(SECRETS_MOUNT))
        elif value.startswith(CONTAINER_PATHS):
            value = str(root / value.lstrip("/"))
        env[key] = value
    for mount in service.get("tmpfs") or []:  # Docker makes these empty at every start
        (root / str(mount).split(":")[0].lstrip("/")).mkdir(parents=True, exist_ok=True)
    return env


def test_entrypoint_gives_the_service_its_settings(
    services: dict[str, dict[str, Any]],
    parsed: dict[str, Dockerfile],
    secrets_dir: Path,
    tmp_path: Path,
) -> None:
    password = (secrets_dir / "postgres_password").read_text()
    for name in ("api", "worker-cpu", "worker-gpu"):
        env = native_env(services[name], image_of(services, name, parsed), tmp_path, secrets_dir)
        result = run_entrypoint(env, "python", "-c", SETTINGS_PROBE)
        assert result.returncode == 0, f"{name}: {result.stderr}"
        seen = json.loads(result.stdout)
        url = make_url(seen["db"])
        assert (url.drivername, url.host, url.port) == ("postgresql+psycopg", "postgres", 5432)
        assert (url.username, url.database, url.password) == ("keyseed", "keyseed", password)
        assert seen["broker"] == "redis://redis:6379/0"
        assert seen["cache"] == env["KEYSEED_CACHE_DIR"]
        assert seen["queue"] == "cpu" and seen["key"] == 32
        if name in WORKERS:
            assert seen["device"] == ("cuda" if name == "worker-gpu" else "cpu")
        assert seen["endpoints"] == []
        # the `local` LLM is the local-llm service
        assert (
            seen["local"]
            == f"http://local-llm:{option(services['local-llm']['command'], '--port')}/v1"
        )


def test_entrypoint_percent_encodes_any_password_and_reads_url_files(tmp_path: Path) -> None:
    password = "p@ss:w/rd%?#&+ é"
    (tmp_path / "pw").write_text(password + "\n", encoding="utf-8")
    probe = "from app.config import Settings; print(Settings().sqlalchemy_url)"
    env = {
        "POSTGRES_HOST": "db.internal",
        "POSTGRES_PORT": "6543",
        "POSTGRES_USER": "kéy seed",
        "POSTGRES_DB": "prod/db",
        "POSTGRES_SSLMODE": "require",
        "POSTGRES_PASSWORD_FILE": str(tmp_path / "pw"),
        "DATABASE_URL": "",
    }
    result = run_entrypoint(env, "python", "-c", probe)
    assert result.returncode == 0, result.stderr
    url = make_url(result.stdout.strip())
    assert (url.host, url.port, url.username) == ("db.internal", 6543, "kéy seed")
    assert (url.password, url.database, url.query) == (password, "prod/db", {"sslmode": "require"})

    (tmp_path / "url").write_text("postgresql://u:secret@elsewhere/x\n", encoding="utf-8")
    result = run_entrypoint({**env, "DATABASE_URL_FILE": str(tmp_path / "url")}, "env")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "DATABASE_URL=postgresql://u:secret@elsewhere/x" in lines
    assert not any(line.startswith("DATABASE_URL_FILE=") for line in lines)

    both = run_entrypoint(
        {"REDIS_URL": "redis://a", "REDIS_URL_FILE": str(tmp_path / "url")}, "env"
    )
    assert both.returncode != 0 and "both REDIS_URL and REDIS_URL_FILE" in both.stderr
    missing = run_entrypoint({"REDIS_URL_FILE": str(tmp_path / "nope")}, "env")
    assert missing.returncode != 0 and "cannot be read" in missing.stderr
    # empty URL variables are dropped: an empty one would mean "embedded SQLite"
    empty = run_entrypoint({"DATABASE_URL": "", "KEYSEED_BROKER_URL": ""}, "env")
    assert empty.returncode == 0
    assert not re.search(r"^(DATABASE_URL|KEYSEED_BROKER_URL)=", empty.stdout, re.M)


# ================================================= the package the images install


def test_the_installed_package_carries_every_file_the_images_need(tmp_path: Path) -> None:
    """The images ``pip install`` the project (not editable): the wheel must hold every
    module, migration and template of app/, workers/ and migrations/."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed in this environment")
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    for package in ("app", "workers", "migrations"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    expected = {
        p.relative_to(source).as_posix()
        for p in source.rglob("*")
        if p.is_file() and p.suffix not in (".pyc", ".pyo")
    } - {"pyproject.toml"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("keyseed-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packaged = set(archive.namelist())
    assert expected - packaged == set()


# ================================================================ running the containers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def with_option(argv: list[str], name: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(name) + 1] = value
    return out


@dataclass
class Running:
    process: subprocess.Popen[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[Running]:
    """A container command run natively through the entry point; stopped on exit."""
    log = cwd / f"{Path(argv[0]).name}-{uuid.uuid4().hex[:6]}.log"
    full = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **env}
    with open(log, "w", encoding="utf-8") as output:
        process = subprocess.Popen(
            ["sh", str(ENTRYPOINT), *argv],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=full,
            cwd=cwd,
            text=True,
            start_new_session=True,
        )
        try:
            yield Running(process, log)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)


def wait_healthy(check: list[str], env: dict[str, str], running: Running, timeout: float) -> None:
    """Run the compose health check until it passes (the way Docker would)."""
    full = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **env}
    shell = check[0] == "CMD-SHELL"
    argv = ["sh", "-c", check[1].replace("$$", "$")] if shell else check[1:]
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        code = running.process.poll()
        assert code is None, f"the process exited with {code}:\n{running.output()}"
        result = subprocess.run(
            argv, capture_output=True, text=True, env=full, timeout=60, check=False
        )
        if result.returncode == 0:
            return
        last = result.stderr[-2000:]
        time.sleep(1)
    raise AssertionError(f"not healthy within {timeout:g} s: {last}\n{running.output()}")


@pytest.fixture(scope="module")
def server_database() -> Iterator[dict[str, str]]:
    """A role with an awkward password and its database, on the test Postgres server:
    the compose services' POSTGRES_* point here instead of at the postgres service."""
    server = create_engine(POSTGRES_SERVER, isolation_level="AUTOCOMMIT")
    try:
        with server.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        server.dispose()
        pytest.skip(f"no Postgres at {POSTGRES_SERVER} ({type(exc).__name__})")
    suffix = uuid.uuid4().hex[:10]
    role, database, password = f"keyseed_c_{suffix}", f"keyseed_c_{suffix}", "p@ss:w/rd%?#&"
    with server.connect() as connection:
        quoted = password.replace("'", "''").replace(":", "\\:")  # no bind parameters
        connection.execute(text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{quoted}'"))
        connection.execute(text(f'CREATE DATABASE "{database}" OWNER "{role}"'))
    url = make_url(POSTGRES_SERVER)
    try:
        yield {
            "POSTGRES_HOST": url.host or "127.0.0.1",
            "POSTGRES_PORT": str(url.port or 5432),
            "POSTGRES_USER": role,
            "POSTGRES_DB": database,
            "password": password,
        }
    finally:
        with server.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            connection.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        server.dispose()


@pytest.fixture(scope="module")
def redis_url() -> str:
    import redis

    url = f"{REDIS_SERVER.rstrip('/')}/{9 + uuid.uuid4().int % 6}"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        pytest.skip(f"no Redis at {REDIS_SERVER} ({type(exc).__name__})")
    return url


@pytest.fixture(scope="module")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="module")
def stack_secrets(stack_root: Path, server_database: dict[str, str]) -> Path:
    directory = stack_root / "secrets"
    result = subprocess.run(["sh", str(INIT_SECRETS), str(directory)], capture_output=True)
    assert result.returncode == 0
    password = directory / "postgres_password"
    password.chmod(0o600)
    password.write_text(server_database["password"] + "\n", encoding="utf-8")
    return directory


@dataclass(frozen=True)
class Stack:
    """The compose services run natively: their images, a root for their container paths,
    the secrets and the Postgres database they share."""

    services: dict[str, dict[str, Any]]
    parsed: dict[str, Dockerfile]
    root: Path
    secrets: Path
    database: dict[str, str]

    def env(self, name: str, redis_url: str = "redis://-") -> dict[str, str]:
        """Service ``name``'s environment, pointed at the test Postgres and Redis."""
        dockerfile = image_of(self.services, name, self.parsed)
        env = native_env(self.services[name], dockerfile, self.root, self.secrets)
        for key in ("POSTGRES_HOST", "POSTGRES_PORT", "POSTGRES_USER", "POSTGRES_DB"):
            if key in env:
                env[key] = self.database[key]
        if "REDIS_URL" in env:
            env["REDIS_URL"] = redis_url
        env["HOSTNAME"] = socket.gethostname()
        return env


@pytest.fixture(scope="module")
def migrated(
    services: dict[str, dict[str, Any]],
    parsed: dict[str, Dockerfile],
    stack_root: Path,
    stack_secrets: Path,
    server_database: dict[str, str],
) -> Stack:
    """The stack after ``migrate`` ran as compose runs it: its command, through the entry
    point."""
    import migrations

    stack = Stack(services, parsed, stack_root, stack_secrets, server_database)
    env = stack.env("migrate")
    result = run_entrypoint(env, *services["migrate"]["command"], cwd=stack_root)
    assert result.returncode == 0, result.stderr
    url = make_url("postgresql+psycopg://").set(
        username=server_database["POSTGRES_USER"],
        password=server_database["password"],
        host=server_database["POSTGRES_HOST"],
        port=int(server_database["POSTGRES_PORT"]),
        database=server_database["POSTGRES_DB"],
    )
    rendered = url.render_as_string(hide_password=False)
    assert migrations.current_revision(rendered) == migrations.head_revision()
    # a second start (the next `up`) is a no-op
    assert run_entrypoint(env, *services["migrate"]["command"], cwd=stack_root).returncode == 0
    return stack


def test_admin_commands_run_in_the_migrate_service(migrated: Stack) -> None:
    """``docker compose run --rm migrate keyseed admin bootstrap`` (docker/README.md)."""
    env = migrated.env("migrate")
    result = run_entrypoint(env, "keyseed", "admin", "bootstrap", cwd=migrated.root)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1]  # the key, printed once
    assert not list(migrated.root.rglob("*.sqlite3"))  # Postgres, not an embedded file


@pytest.mark.slow
def test_api_runs_natively_and_passes_its_health_check(migrated: Stack, redis_url: str) -> None:
    services = migrated.services
    env = migrated.env("api", redis_url)
    env["KEYSEED_METRICS_TOKEN"] = "compose-metrics-token"  # what a Prometheus scraper sends
    port = free_port()
    argv = with_option(services["api"]["command"], "--port", str(port))
    argv = with_option(argv, "--host", "127.0.0.1")
    check = healthcheck_test(services["api"])
    check = [part.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for part in check]
    with started(argv, env, migrated.root) as running:
        wait_healthy(check, env, running, timeout=90)
        import httpx

        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).json()
        assert ready["checks"] == {"database": "ok", "broker": "ok"}
        # the uvicorn processes (UVICORN_WORKERS) report through PROMETHEUS_MULTIPROC_DIR
        assert int(env["UVICORN_WORKERS"]) > 1
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 401
        metrics = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": "Bearer compose-metrics-token"},
            timeout=10,
        )
        assert metrics.status_code == 200
        assert 'route="/readyz"' in metrics.text
        assert list(Path(env["PROMETHEUS_MULTIPROC_DIR"]).glob("*.db"))


@pytest.mark.slow
def test_cpu_worker_runs_natively_and_passes_its_health_check(
    migrated: Stack, redis_url: str
) -> None:
    services = migrated.services
    env = migrated.env("worker-cpu", redis_url)
    argv = [str(a) for a in services["worker-cpu"]["command"]]
    argv = with_option(argv, "--hostname", f"cpu-{uuid.uuid4().hex[:6]}@%h")
    node = option(argv, "--hostname")
    assert node is not None
    check = healthcheck_test(services["worker-cpu"])
    check = [check[0], check[1].replace('"cpu@$$HOSTNAME"', f'"{node.split("@")[0]}@$$HOSTNAME"')]
    with started(argv, env, migrated.root) as running:
        wait_healthy(check, env, running, timeout=120)
    # a warm shutdown on SIGTERM, as `docker compose stop` sends it
    assert running.process.returncode == 0, running.output()


@pytest.mark.slow
@pytest.mark.llm
def test_local_llm_runs_natively_and_passes_its_health_check(
    services: dict[str, dict[str, Any]], parsed: dict[str, Dockerfile], tmp_path: Path
) -> None:
    dockerfile = image_of(services, "local-llm", parsed)
    env = native_env(services["local-llm"], dockerfile, tmp_path, tmp_path)
    port = free_port()
    argv = [str(a) for a in services["local-llm"]["command"]]
    argv = with_option(with_option(argv, "--port", str(port)), "--host", "127.0.0.1")
    argv = with_option(argv, "--threads", "1")
    check = healthcheck_test(services["local-llm"])
    check = [part.replace("127.0.0.1:8081", f"127.0.0.1:{port}") for part in check]
    with started(argv, env, tmp_path) as running:
        wait_healthy(check, env, running, timeout=180)
