#!/bin/bash
# The stand-in postgres image's entry point (tests/realcluster/images.py), with the official image's contract for
# what deploy/components/temporal uses: on an empty PGDATA, initdb with POSTGRES_USER as the superuser and
# POSTGRES_PASSWORD as its password (scram-sha-256 over TCP from anywhere, trust on the local socket), the database
# POSTGRES_DB (default: the user's name) created, listen on every address; then `postgres` with the given arguments.
# Run as the postgres user (999), as deploy/ runs it; the official image also starts as root and steps down.
set -Eeuo pipefail

if [[ "${1:-}" != postgres ]]; then
  exec "$@"
fi
: "${PGDATA:=/var/lib/postgresql/data}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
  if [[ -z "${POSTGRES_PASSWORD:-}" ]]; then
    echo "docker-entrypoint.sh: POSTGRES_PASSWORD is empty: refusing to initialise $PGDATA without a password" >&2
    exit 1
  fi
  mkdir -p "$PGDATA"
  chmod 0700 "$PGDATA"
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
  rm -f "$pwfile"
  printf '\nhost all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
  printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
  if [[ "$db" != postgres ]]; then
    echo "CREATE DATABASE \"$db\";" | postgres --single -D "$PGDATA" -j postgres >/dev/null
  fi
  echo "docker-entrypoint.sh: initialised $PGDATA (superuser $user, database $db)"
fi
exec "$@"
