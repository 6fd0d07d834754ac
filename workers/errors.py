"""One exception hierarchy for the core.

Every error raised on bad input names what was wrong (``field``) so a command line can
print ``--epsilon-kde: must be finite and > 0`` and a service can answer problem+json
with the offending field. Messages never quote private text.
"""

from __future__ import annotations


class KeyseedError(Exception):
    """Base class of every error the core raises on purpose."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class ConfigError(KeyseedError):
    """A parameter is out of range or inconsistent with another."""


class InputDataError(KeyseedError):
    """The corpus or a vocabulary file cannot be used as given."""


class LLMError(KeyseedError):
    """The language-model endpoint failed beyond what retries could mend."""
