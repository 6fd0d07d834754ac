"""keyseed's Python client: ``from keyseed.client import Client`` (see ``docs/client.md``).

The client needs only httpx and pydantic; it imports nothing from the service.
"""

from keyseed.client import (
    BudgetExceeded,
    Client,
    Conflict,
    Forbidden,
    JobFailed,
    JobTimeout,
    KeyseedError,
    NotFound,
    ValidationFailed,
)

__all__ = [
    "BudgetExceeded",
    "Client",
    "Conflict",
    "Forbidden",
    "JobFailed",
    "JobTimeout",
    "KeyseedError",
    "NotFound",
    "ValidationFailed",
]
