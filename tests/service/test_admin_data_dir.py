"""``keyseed admin`` finds the service's database as the service does, from any directory.

With no database URL, the database is the SQLite file in the data folder
(``--data-dir``, ``KEYSEED_DATA_DIR`` or ``./var``). Run from another directory, a
command must not create an empty database there: it is refused with the path it looked
at and how to point elsewhere; ``migrate`` creates a database and says where.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.service import factories

REPO = factories.REPO
UNSET = ("DATABASE_URL", "KEYSEED_DATABASE_URL", "KEYSEED_DATA_DIR", "KEYSEED_DATA_KEY")


def admin(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in UNSET}
    environment.update(PYTHONPATH=str(REPO), **env)
    return factories.keyseed("admin", *args, env=environment, cwd=cwd)


def test_a_command_from_another_directory_refuses_to_create_an_empty_database(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = admin(elsewhere, "create-org", "Clinic", "--kind", "owner")
    assert result.returncode == 1
    looked_at = elsewhere / "var" / "keyseed.sqlite3"
    assert f"no database at {looked_at}" in result.stderr
    assert "./var, under the current directory" in result.stderr
    assert "--data-dir or KEYSEED_DATA_DIR" in result.stderr
    assert "keyseed admin migrate" in result.stderr
    assert result.stdout == ""
    assert list(elsewhere.iterdir()) == []  # neither var/ nor a database file was made

    named = admin(elsewhere, "bootstrap", KEYSEED_DATA_DIR=str(tmp_path / "nothing"))
    assert named.returncode == 1
    assert f"no database at {tmp_path / 'nothing' / 'keyseed.sqlite3'}" in named.stderr
    assert f"KEYSEED_DATA_DIR={tmp_path / 'nothing'}" in named.stderr
    assert not (tmp_path / "nothing").exists()


def test_the_service_data_folder_is_found_from_any_directory(tmp_path: Path) -> None:
    service = tmp_path / "service"
    data = service / "var"
    service.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    # the service's own directory, with its default ./var: migrate creates and says where
    made = admin(service, "migrate")
    assert made.returncode == 0, made.stderr
    assert f"created a new database at {data / 'keyseed.sqlite3'}" in made.stderr
    again = admin(service, "migrate")
    assert again.returncode == 0 and "created" not in again.stderr

    # from elsewhere: --data-dir, relative to where the command runs, or KEYSEED_DATA_DIR
    org = admin(first, "--data-dir", "../service/var", "create-org", "Clinic", "--kind", "owner")
    assert org.returncode == 0, org.stderr
    key = admin(second, "bootstrap", KEYSEED_DATA_DIR=str(data))
    assert key.returncode == 0, key.stderr
    assert key.stdout.strip().startswith("ks_")
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []

    # both wrote to the one database: bootstrap again is refused there
    repeated = admin(service, "bootstrap")
    assert repeated.returncode == 1 and "exists already" in repeated.stderr


def test_a_sqlite_url_to_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "db" / "keyseed.sqlite3"
    result = admin(tmp_path, "create-key", "--role", "admin", DATABASE_URL=f"sqlite:///{missing}")
    assert result.returncode == 1
    assert f"no database at {missing} (from the database URL" in result.stderr
    assert not missing.parent.exists()
