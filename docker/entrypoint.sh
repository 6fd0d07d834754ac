#!/bin/sh
# Entry point of the keyseed images (API, CPU worker, GPU worker).
#
# The service reads its own secret files (KEYSEED_DATA_KEY_FILE, an endpoint's
# api_key_file, KEYSEED_LLM_API_KEY_FILE). The connection URLs carry passwords but are
# plain settings, so this script resolves them before the command starts:
#
#   1. DATABASE_URL_FILE, KEYSEED_DATABASE_URL_FILE, REDIS_URL_FILE, KEYSEED_REDIS_URL_FILE,
#      KEYSEED_BROKER_URL_FILE: the variable is read from the file (a Docker secret);
#      giving both a variable and its _FILE twin is an error.
#   2. With no database URL at all but POSTGRES_HOST set, DATABASE_URL is built from
#      POSTGRES_HOST, POSTGRES_PORT (5432), POSTGRES_USER (keyseed), POSTGRES_DB (the
#      user), POSTGRES_SSLMODE (optional) and the password from POSTGRES_PASSWORD_FILE
#      (the Docker secret the postgres container reads too) or POSTGRES_PASSWORD; each
#      part is percent-encoded, so any password works.
#
# Empty URL variables are removed: the service would take an empty database URL as
# "embedded" and quietly use a SQLite file. Then the command is exec'ed.
set -eu

fail() {
    echo "keyseed-entrypoint: $*" >&2
    exit 64
}

URL_VARIABLES="DATABASE_URL KEYSEED_DATABASE_URL REDIS_URL KEYSEED_REDIS_URL KEYSEED_BROKER_URL"

for name in $URL_VARIABLES; do
    eval "value=\${$name:-}"
    eval "file=\${${name}_FILE:-}"
    if [ -n "$file" ]; then
        [ -z "$value" ] || fail "both $name and ${name}_FILE are set; give one"
        [ -r "$file" ] || fail "${name}_FILE names $file, which cannot be read"
        value=$(cat "$file")
        [ -n "$value" ] || fail "$file (${name}_FILE) is empty"
        export "$name=$value"
    fi
    unset "${name}_FILE"
    if [ -z "$value" ]; then
        unset "$name"
    fi
done

if [ -z "${DATABASE_URL:-}${KEYSEED_DATABASE_URL:-}" ] && [ -n "${POSTGRES_HOST:-}" ]; then
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        [ -r "$POSTGRES_PASSWORD_FILE" ] || fail "cannot read POSTGRES_PASSWORD_FILE ($POSTGRES_PASSWORD_FILE)"
        KEYSEED_PG_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
    else
        KEYSEED_PG_PASSWORD=${POSTGRES_PASSWORD:-}
    fi
    export KEYSEED_PG_PASSWORD
    # The password goes through the environment, never through a command line.
    DATABASE_URL=$(python -c '
import os
from urllib.parse import quote

env = os.environ
user = env.get("POSTGRES_USER") or "keyseed"
auth = quote(user, safe="")
if env["KEYSEED_PG_PASSWORD"]:
    auth += ":" + quote(env["KEYSEED_PG_PASSWORD"], safe="")
host = env["POSTGRES_HOST"]
port = env.get("POSTGRES_PORT") or "5432"
database = quote(env.get("POSTGRES_DB") or user, safe="")
url = f"postgresql://{auth}@{host}:{port}/{database}"
if env.get("POSTGRES_SSLMODE"):
    url += "?sslmode=" + quote(env["POSTGRES_SSLMODE"], safe="")
print(url)
') || fail "could not build DATABASE_URL from the POSTGRES_* variables"
    export DATABASE_URL
    unset KEYSEED_PG_PASSWORD POSTGRES_PASSWORD
fi

[ "$#" -gt 0 ] || fail "no command given"
exec "$@"
