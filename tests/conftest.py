"""Shared fixtures. Paths to the read-only material beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KEYSEED_SHARED", REPO.parent / "shared"))
AG_NEWS = SHARED / "data" / "ag_news_test.csv"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def ag_news_path() -> Path:
    if not AG_NEWS.exists():
        pytest.skip(f"AG News is not available at {AG_NEWS} (../shared is absent); skipping")
    return AG_NEWS
