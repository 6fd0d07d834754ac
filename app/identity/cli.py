"""``keyseed admin``: the platform's first key, organisations, keys, people, migrations.

Every command works on the database of the service settings, found as the service finds
it (:class:`app.config.Settings`): ``KEYSEED_DATABASE_URL`` or ``DATABASE_URL``, else the
embedded SQLite file in the data folder (``--data-dir``, else ``KEYSEED_DATA_DIR``, else
``./var`` under the current directory, as for ``keyseed serve``). Except ``migrate``, a
command expects that database to exist with a current schema: where its SQLite file does
not exist it is refused with the path it looked at and how to point elsewhere, instead of
creating an empty database beside the service's. ``migrate`` creates it, and says where.
Secrets are printed once, as the last line of stdout; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import getpass
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.config import Settings

HANDLER = "app.identity.cli"
Handler = Callable[[argparse.Namespace], int]


def register(subparsers: Any) -> None:
    admin = subparsers.add_parser(
        "admin",
        help="administer the keyseed service",
        description="Administer the keyseed service's database: the one of "
        "KEYSEED_DATABASE_URL or DATABASE_URL, else the SQLite file in the data folder "
        "(--data-dir, $KEYSEED_DATA_DIR or ./var, as for keyseed serve).",
    )
    admin.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the service's data folder ($KEYSEED_DATA_DIR or ./var), where its SQLite "
        "database is when no database URL is set",
    )
    commands = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", help="bring the database schema up to date")
    migrate.add_argument(
        "--revision", default="head", help="the Alembic revision to go to (default: head)"
    )
    migrate.set_defaults(handler=f"{HANDLER}:migrate")

    bootstrap = commands.add_parser("bootstrap", help="make the first admin key")
    bootstrap.add_argument(
        "--force", action="store_true", help="make another admin key even if one exists"
    )
    bootstrap.set_defaults(handler=f"{HANDLER}:bootstrap")

    org = commands.add_parser("create-org", help="create an organisation; prints its id")
    org.add_argument("name", help="the organisation's name")
    org.add_argument(
        "--kind",
        choices=("owner", "client"),
        required=True,
        help="owner: uploads corpora and runs jobs; client: receives releases",
    )
    org.add_argument(
        "--epsilon-budget", type=float, help="an owner's privacy budget ε (default: the setting)"
    )
    org.add_argument(
        "--delta-budget", type=float, help="an owner's privacy budget δ (default: the setting)"
    )
    org.set_defaults(handler=f"{HANDLER}:create_org")

    key = commands.add_parser("create-key", help="create an API key; prints the key")
    key.add_argument("--org", type=uuid.UUID, help="organisation id (not for admin/auditor)")
    key.add_argument(
        "--role",
        choices=("owner", "client", "admin", "auditor"),
        required=True,
        help="owner or client (of --org's kind), or a platform admin or auditor",
    )
    key.add_argument("--name", default="", help="a label for the key, to recognise it by")
    key.set_defaults(handler=f"{HANDLER}:create_key")

    revoke = commands.add_parser("revoke-key", help="revoke an API key")
    revoke.add_argument("key", help="the key's id, its prefix, or the key itself")
    revoke.set_defaults(handler=f"{HANDLER}:revoke_key")

    user = commands.add_parser("create-user", help="create a dashboard user (admin|auditor)")
    user.add_argument("--username", required=True, help="the name to sign in with")
    user.add_argument(
        "--role", choices=("admin", "auditor"), required=True, help="what the user may do"
    )
    user.add_argument("--email", help="the user's e-mail address (optional)")
    user.add_argument(
        "--password-file", type=Path, help="else $KEYSEED_ADMIN_PASSWORD, else a prompt"
    )
    user.set_defaults(handler=f"{HANDLER}:create_user")


def _fail(message: str) -> int:
    print(f"keyseed admin: {message}", file=sys.stderr)
    return 1


def _settings(args: argparse.Namespace) -> Settings:
    """The service's settings, with ``--data-dir`` as ``KEYSEED_DATA_DIR``."""
    from app.config import get_settings

    if getattr(args, "data_dir", None) is not None:
        os.environ["KEYSEED_DATA_DIR"] = str(args.data_dir)
        get_settings.cache_clear()
    return get_settings()


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite database URL (None for another database, or one in memory)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).resolve()


def _missing_database(settings: Settings) -> str | None:
    """Why the settings name no existing database, or None: a SQLite file that does not
    exist would be created empty, beside the service's."""
    path = _sqlite_file(settings.sqlalchemy_url)
    if path is None or path.exists():
        return None
    return (
        f"no database at {path} (from {settings.database_source()}); point keyseed admin at "
        "the service's with --data-dir or KEYSEED_DATA_DIR (or KEYSEED_DATABASE_URL), or run "
        "`keyseed admin migrate` to create a new database there"
    )


def _existing_database(handler: Handler) -> Handler:
    """``handler``, refused before it imports anything when the database does not exist."""

    @functools.wraps(handler)
    def checked(args: argparse.Namespace) -> int:
        missing = _missing_database(_settings(args))
        return _fail(missing) if missing is not None else handler(args)

    return checked


def _run(args: argparse.Namespace, action: Any) -> int:
    """Run ``action(session)`` in one transaction against a current schema."""
    import migrations
    from app.db import Database
    from app.errors import Problem

    settings = _settings(args)
    url = settings.sqlalchemy_url
    try:
        current = migrations.current_revision(url)
    except Exception as exc:
        return _fail(f"cannot reach the database ({type(exc).__name__})")
    if current != migrations.head_revision():
        return _fail("the database schema is not current: run `keyseed admin migrate`")
    database = Database.from_settings(settings)
    try:
        with database.transaction() as session:
            output = action(session)
    except Problem as exc:
        return _fail(str(exc.detail or exc.title))
    finally:
        database.dispose()
    print(output)
    return 0


def migrate(args: argparse.Namespace) -> int:
    import migrations

    settings = _settings(args)
    path = _sqlite_file(settings.sqlalchemy_url)
    created = path is not None and not path.exists()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    migrations.upgrade(settings.sqlalchemy_url, args.revision)
    where = f"{path}" if path is not None else f"the database of {settings.database_source()}"
    if created:
        print(
            f"created a new database at {where} (from {settings.database_source()})",
            file=sys.stderr,
        )
    print(f"database {where} at revision {args.revision}", file=sys.stderr)
    return 0


@_existing_database
def bootstrap(args: argparse.Namespace) -> int:
    from app.identity import service

    def action(session: Any) -> str:
        key, plaintext = service.bootstrap(session, force=args.force)
        print(f"admin key {key.prefix} created; it is shown once:", file=sys.stderr)
        return plaintext

    return _run(args, action)


@_existing_database
def create_org(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from app.identity import service
    from app.identity.policy import Actor
    from app.identity.schemas import OrganisationIn
    from app.ledger import service as ledger

    try:
        body = OrganisationIn(
            name=args.name,
            kind=args.kind,
            epsilon_budget=args.epsilon_budget,
            delta_budget=args.delta_budget,
        )
    except ValidationError as exc:
        field = exc.errors()[0]["loc"][0]
        return _fail(f"--{str(field).replace('_', '-')}: {exc.errors()[0]['msg']}")
    budget = ledger.initial_budget(_settings(args), body.epsilon_budget, body.delta_budget)

    def action(session: Any) -> str:
        organisation = service.create_organisation(
            session,
            Actor.system("cli"),
            name=body.name,
            kind=body.kind,
            epsilon_budget=budget.epsilon,
            delta_budget=budget.delta,
        )
        return str(organisation.id)

    return _run(args, action)


@_existing_database
def create_key(args: argparse.Namespace) -> int:
    from app.identity import service
    from app.identity.policy import Actor

    def action(session: Any) -> str:
        key, plaintext = service.create_key(
            session, Actor.system("cli"), organisation_id=args.org, role=args.role, name=args.name
        )
        print(f"{args.role} key {key.prefix} created; it is shown once:", file=sys.stderr)
        return plaintext

    return _run(args, action)


@_existing_database
def revoke_key(args: argparse.Namespace) -> int:
    from app.errors import NotFound
    from app.identity import repository, service
    from app.identity.policy import Actor

    def action(session: Any) -> str:
        try:
            key_id = uuid.UUID(args.key)
        except ValueError:
            prefix = args.key.split("_")[1] if args.key.startswith("ks_") else args.key
            found = repository.key_by_prefix(session, prefix)
            if found is None:
                raise NotFound("no such key") from None
            key_id = found.id
        key = service.revoke_key(session, Actor.system("cli"), key_id)
        return str(key.id)

    return _run(args, action)


def _password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        return str(args.password_file.read_text(encoding="utf-8")).rstrip("\n")
    if os.environ.get("KEYSEED_ADMIN_PASSWORD"):
        return os.environ["KEYSEED_ADMIN_PASSWORD"]
    if not sys.stdin.isatty():
        raise SystemExit(_fail("give --password-file or set KEYSEED_ADMIN_PASSWORD"))
    first = getpass.getpass("password: ")
    if first != getpass.getpass("again: "):
        raise SystemExit(_fail("the passwords differ"))
    return first


@_existing_database
def create_user(args: argparse.Namespace) -> int:
    from app.identity import service
    from app.identity.policy import Actor

    password = _password(args)

    def action(session: Any) -> str:
        user = service.create_user(
            session,
            Actor.system("cli"),
            username=args.username,
            role=args.role,
            password=password,
            email=args.email,
        )
        return str(user.id)

    return _run(args, action)
