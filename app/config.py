"""The service's settings: :class:`workers.settings.CoreSettings` plus what the API needs.

Every name is read from ``KEYSEED_<NAME>``; ``DATABASE_URL`` and ``REDIS_URL`` are
honoured as well. With neither set the service runs embedded: a SQLite file and a
SQLite-backed Celery broker under ``data_dir``, and a document key generated there.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from workers.settings import CoreSettings

DATA_KEY_FILE = "data.key"
DATABASE_FILE = "keyseed.sqlite3"  # the embedded database, in the data folder
BUILTIN_LLMS = ("none", "local")  # no prompting; the packaged model served locally
LEASE_SECONDS = 60.0  # default of job_lease_seconds


class LLMEndpointSettings(BaseModel):
    """An OpenAI-compatible endpoint a job may name; its key never leaves the server."""

    base_url: str = Field(pattern=r"^https?://")
    model: str = Field(min_length=1)
    api_key: SecretStr = SecretStr("")
    api_key_file: Path | None = None

    def key(self) -> str:
        if self.api_key.get_secret_value():
            return self.api_key.get_secret_value()
        if self.api_key_file is not None:
            return self.api_key_file.read_text(encoding="utf-8").strip()
        return ""


class Settings(CoreSettings):
    model_config = SettingsConfigDict(
        env_prefix="KEYSEED_", extra="ignore", validate_by_name=True, hide_input_in_errors=True
    )

    data_dir: Path = Path("var")
    database_url: str = Field(
        default="", validation_alias=AliasChoices("KEYSEED_DATABASE_URL", "DATABASE_URL")
    )
    broker_url: str = Field(
        default="",
        validation_alias=AliasChoices("KEYSEED_BROKER_URL", "KEYSEED_REDIS_URL", "REDIS_URL"),
    )
    data_key: SecretStr = SecretStr("")  # base64 of 32 bytes (AES-256-GCM)
    data_key_file: Path | None = None
    # Each dataset's data key, wrapped by the data key (``data_dir/keyring`` by default):
    # a directory the API and every worker share, backed up apart from the database.
    keyring_dir: Path | None = None
    # Upload limits, one scheme: KEYSEED_MAX_UPLOAD_BYTES caps a dataset's whole file
    # (all its chunks), KEYSEED_MAX_UPLOAD_REQUEST_BYTES one request's body (a chunk, or
    # a whole file sent in one request); 413 above either, naming it.
    max_upload_bytes: int = Field(default=16 * 2**30, ge=1024)
    max_upload_request_bytes: int = Field(default=256 * 2**20, ge=1024)

    max_json_bytes: int = Field(default=2**20, ge=1024)
    llm_endpoints: dict[str, LLMEndpointSettings] = Field(default_factory=dict)
    sequences_queue: Literal["cpu", "gpu"] = "cpu"  # where stages 1-6 run
    # Shards of a shardable DP-KPS job (app.jobs.shards): its private rows are split by
    # privacy unit across this many map tasks, each streaming its own rows and returning
    # additive per-class aggregates, and one reduce adds the noise once. 1 (the default)
    # runs the same streamed map/reduce in one task, with memory flat in the corpus; set
    # it to about the number of worker processes that consume the sequences queue. Needs
    # the Redis broker (the chord's counter); on the embedded broker jobs run whole.
    job_shards: int = Field(default=1, ge=1, le=256)
    job_soft_time_limit: int = Field(default=6 * 3600, ge=1)
    job_time_limit: int = Field(default=6 * 3600 + 300, ge=1)
    # Redis key prefix of every broker key (isolates deployments sharing one Redis).
    broker_key_prefix: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9._:-]*$")
    # The running packaged LLM server (``keyseed serve`` starts one and sets this); when
    # empty, a job naming the "local" LLM starts one for the duration of its prompting.
    local_llm_url: str = Field(default="", pattern=r"^(https?://.+)?$")
    llm_max_retries: int = Field(default=5, ge=0, le=100)  # per sequence, per prompting run
    llm_backoff_base: float = Field(default=0.5, ge=0, le=3600)
    llm_backoff_max: float = Field(default=30.0, ge=0, le=3600)
    max_sequences_per_job: int = Field(default=100_000, ge=1)  # per_class × labels, or total
    metrics_token: SecretStr = SecretStr("")  # a bearer token for /metrics (else a platform key)
    progress_interval: float = Field(default=2.0, ge=0, le=3600)  # seconds between writes
    # A worker process counts as dead this long after it last said it was alive (it says
    # so every quarter of it); its jobs are then sent to a worker again.
    job_lease_seconds: float = Field(default=LEASE_SECONDS, ge=1, le=3600)
    log_level: str = "INFO"
    log_json: bool = True
    # The admin dashboard's session cookie is Secure over https ("auto"), or always/never.
    admin_cookie_secure: Literal["auto", "always", "never"] = "auto"
    admin_session_hours: float = Field(default=8.0, gt=0, le=7 * 24)
    # The API server (``keyseed api``, ``keyseed serve``). X-Forwarded-For and -Proto are
    # believed only from these addresses or networks (comma-separated; none by default).
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = ()
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=2**20)  # 400 above it
    # A request's line and headers must arrive within it, and its body may not pause for
    # longer (408 and the connection closed); idle connections close after keep-alive.
    request_timeout: float = Field(default=30.0, gt=0, le=3600)
    keep_alive_timeout: int = Field(default=5, ge=1, le=3600)
    # The privacy budget (ε, δ) a new owner organisation gets; admins change it per
    # organisation (PATCH /v1/organisations/{id}/budget) and its datasets' caps are
    # carved out of it.
    default_organisation_epsilon: float = Field(default=10.0, gt=0, le=1e6)
    default_organisation_delta: float = Field(default=1e-6, ge=0, lt=1)
    # Per-organisation limits, so that one organisation cannot hold the workers for
    # everyone (refused in the dry run and at submit: problem type limit-exceeded). Jobs
    # of one organisation queued or running at once; the LLM calls and tokens (calls ×
    # max_tokens per call, as the dry run plans them) one job may ask for; the LLM
    # requests one job may keep in flight.
    org_max_active_jobs: int = Field(default=10, ge=1, le=10_000)
    org_max_llm_calls_per_job: int = Field(default=20_000, ge=1)
    org_max_llm_tokens_per_job: int = Field(default=10_000_000, ge=1)
    org_max_llm_concurrency: int = Field(default=32, ge=1, le=1024)
    # Fair queueing: at most this many jobs of one organisation are sent to the workers
    # (queued in the broker or running) at once; its other jobs wait in the database and
    # are sent, the organisations taking turns, as earlier ones end (app.jobs.admission).
    org_dispatched_jobs: int = Field(default=1, ge=1, le=10_000)

    @field_validator("llm_endpoints")
    @classmethod
    def _no_reserved_names(
        cls, value: dict[str, LLMEndpointSettings]
    ) -> dict[str, LLMEndpointSettings]:
        clash = sorted(set(value) & set(BUILTIN_LLMS))
        if clash:
            raise ValueError(f"endpoint names {clash} are reserved")
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxy_networks(cls, value: object) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise ValueError("give addresses or networks, comma-separated")
        try:
            networks = [
                ipaddress.ip_network(str(item).strip(), strict=False)
                for item in items
                if str(item).strip()
            ]
        except ValueError:
            raise ValueError("an entry is not an IP address or network") from None
        return tuple(str(network) for network in networks)

    @property
    def embedded(self) -> bool:
        return not self.database_url

    @property
    def data_path(self) -> Path:
        """The data folder, absolute: ``KEYSEED_DATA_DIR`` (default ``var``) taken from the
        current directory, as every process of the service (``keyseed serve``, its API and
        workers, ``keyseed admin``) resolves it."""
        return self.data_dir.resolve()

    def database_source(self) -> str:
        """Where the database's location came from, in words, for a message."""
        if self.database_url:
            return "the database URL (KEYSEED_DATABASE_URL or DATABASE_URL)"
        if os.environ.get("KEYSEED_DATA_DIR"):
            return f"the data folder KEYSEED_DATA_DIR={os.environ['KEYSEED_DATA_DIR']}"
        return "the default data folder ./var, under the current directory"

    @property
    def upload_request_limit(self) -> int:
        """The most bytes of a file one request carries (both limits apply)."""
        return min(self.max_upload_bytes, self.max_upload_request_bytes)

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            url = self.database_url
            if url.startswith("postgres://"):
                url = "postgresql://" + url.removeprefix("postgres://")
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
            return url
        return f"sqlite:///{self.data_path / DATABASE_FILE}"

    @property
    def keyring_path(self) -> Path:
        return self.keyring_dir if self.keyring_dir is not None else self.data_dir / "keyring"

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.data_path / 'broker.sqlite3'}"

    @property
    def llm_names(self) -> tuple[str, ...]:
        """Every name a job spec may give as ``llm``."""
        return (*BUILTIN_LLMS, *sorted(self.llm_endpoints))

    def document_key(self) -> bytes:
        """The AES-256 key of documents at rest.

        From ``KEYSEED_DATA_KEY`` or ``KEYSEED_DATA_KEY_FILE`` (base64 of 32 bytes). When
        neither is set and the service is embedded, a key is generated once into
        ``data_dir/data.key`` (mode 0600); a server database requires a configured key.
        """
        text = self.data_key.get_secret_value().strip()
        if not text and self.data_key_file is not None:
            text = self.data_key_file.read_text(encoding="utf-8").strip()
        if not text:
            if not self.embedded:
                raise RuntimeError("set KEYSEED_DATA_KEY or KEYSEED_DATA_KEY_FILE")
            text = _embedded_key(self.data_dir / DATA_KEY_FILE)
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != 32:
            raise RuntimeError("the document key must be the base64 of 32 random bytes")
        return key


def _embedded_key(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(base64.b64encode(os.urandom(32)).decode("ascii") + "\n")
    return path.read_text(encoding="utf-8").strip()


@functools.cache
def get_settings() -> Settings:
    return Settings()
