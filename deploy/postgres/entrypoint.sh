#!/bin/sh
# First start: a cluster owned by role `crossaudit` whose password is the file POSTGRES_PASSWORD_FILE
# names (a secret), scram-sha-256 for every connection, and database `crossaudit`. Then: postgres.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD_FILE:-}" ] || [ ! -r "$POSTGRES_PASSWORD_FILE" ]; then
        echo "error: POSTGRES_PASSWORD_FILE must name a readable file (the crossaudit role's password)" >&2
        exit 1
    fi
    initdb -D "$PGDATA" -U crossaudit --pwfile="$POSTGRES_PASSWORD_FILE" \
        --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "CREATE DATABASE crossaudit OWNER crossaudit;" | postgres --single -D "$PGDATA" -j postgres >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql "$@"
