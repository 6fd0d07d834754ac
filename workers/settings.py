"""Settings the core and the offline command line read from the environment.

Every name is prefixed ``KEYSEED_`` (``KEYSEED_EMBEDDING_MODEL``, ``KEYSEED_LLM_BASE_URL``
…); secrets may also come from a file named by ``KEYSEED_<NAME>_FILE`` (Docker and
Kubernetes secrets). The service's settings (``app.config``) extend this class, so a
worker and the command line read the same variables the same way.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache() -> Path:
    return Path.home() / ".cache" / "keyseed"


class CoreSettings(BaseSettings):
    """Models, caches and the LLM endpoint used when none is named explicitly."""

    model_config = SettingsConfigDict(env_prefix="KEYSEED_", extra="ignore")

    cache_dir: Path = Field(default_factory=_default_cache)
    embedding_model: str = "default"  # the packaged all-MiniLM-L6-v2, or a name or path
    device: str = "auto"  # auto | cpu | cuda[:n]

    # OpenAI-compatible endpoint; empty base URL means the packaged local model.
    llm_base_url: str = ""
    llm_model: str = ""
    llm_api_key: SecretStr = SecretStr("")
    llm_api_key_file: Path | None = None
    llm_timeout: float = Field(default=120.0, gt=0)
    llm_concurrency: int = Field(default=8, ge=1, le=256)
    llm_max_calls: int = Field(default=100_000, ge=1)
    llm_max_tokens: int = Field(default=256, ge=1, le=8192)

    @model_validator(mode="after")
    def _read_secret_files(self) -> CoreSettings:
        if self.llm_api_key_file is not None and not self.llm_api_key.get_secret_value():
            key = self.llm_api_key_file.read_text(encoding="utf-8").strip()
            object.__setattr__(self, "llm_api_key", SecretStr(key))
        return self

    @property
    def embedding_cache_dir(self) -> Path:
        return self.cache_dir / "embeddings"
