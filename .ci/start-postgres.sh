#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the tests and export EVENTSTORE_TEST_POSTGRES_URL.
#
# Source it (`. .ci/start-postgres.sh`) so the variable and the stop trap land in the caller's
# shell; .ci/run does. Run as root (CI and the dev machines are): the cluster is initdb-ed as
# the `postgres` user in a fresh temp dir, trust auth on 127.0.0.1 and a private socket dir
# only, and stopped (`pg_ctl -m fast -w stop`) and removed by an EXIT trap.
# Optional: EVENTSTORE_PG_PORT (default 55400 + a few tries upward if taken).
# Honours an already exported EVENTSTORE_TEST_POSTGRES_URL: then it starts nothing.

_es_pg_main() {
    if [ -n "${EVENTSTORE_TEST_POSTGRES_URL:-}" ]; then
        echo "start-postgres: using the server at the given EVENTSTORE_TEST_POSTGRES_URL" >&2
        return 0
    fi
    local bindir
    bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
        echo "start-postgres: installing Debian's postgresql" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null && apt-get install -y -qq postgresql >/dev/null || return 1
        bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    fi
    # Debian's package starts its own `main` cluster on 5432; we never use it.
    local d
    d=$(mktemp -d /tmp/eventstore-pg.XXXXXX) || return 1
    chmod 755 "$d"
    mkdir -m 700 "$d/data" && mkdir -m 755 "$d/sock" || return 1
    chown postgres:postgres "$d/data" "$d/sock" || return 1
    su postgres -s /bin/sh -c "'$bindir/initdb' -D '$d/data' -U postgres -A trust -E UTF8 --no-locale" \
        >"$d/initdb.log" 2>&1 || { cat "$d/initdb.log" >&2; return 1; }
    local port="${EVENTSTORE_PG_PORT:-55400}" tries=0
    while :; do
        if su postgres -s /bin/sh -c "'$bindir/pg_ctl' -D '$d/data' -l '$d/data/server.log' -w -t 60 \
            -o \"-k '$d/sock' -p $port -c listen_addresses=127.0.0.1 -c max_connections=200 -c max_prepared_transactions=10\" start" \
            >"$d/pg_ctl.log" 2>&1; then
            break
        fi
        tries=$((tries + 1))
        if [ "$tries" -ge 20 ]; then
            cat "$d/pg_ctl.log" "$d/data/server.log" >&2
            return 1
        fi
        port=$((port + 1))
    done
    "$bindir/createdb" -h "$d/sock" -p "$port" -U postgres eventstore_test || return 1
    export EVENTSTORE_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/eventstore_test"
    export EVENTSTORE_PG_BINDIR="$bindir" EVENTSTORE_PG_DIR="$d"
    # Chain onto any EXIT trap the caller already has: `trap -p` prints it shell-quoted,
    # so it is unquoted by the shell itself (eval of `set --`), never by sed, which broke
    # on a trap holding quotes (start-redis.sh's, sourced first).
    local prev=""
    eval "set -- $(trap -p EXIT)"
    if [ "$#" -ge 3 ]; then
        prev="$3"
    fi
    trap "su postgres -s /bin/sh -c \"'$bindir/pg_ctl' -D '$d/data' -m fast -w stop\" >/dev/null 2>&1; rm -rf '$d'; ${prev:-:}" EXIT
    echo "start-postgres: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($d)" >&2
}

_es_pg_main || { echo "start-postgres: could not start PostgreSQL" >&2; return 1 2>/dev/null || exit 1; }
unset -f _es_pg_main
# When executed rather than sourced, keep the server up until this shell exits is pointless:
# say so instead of starting and immediately stopping a server.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "start-postgres: source this script (. .ci/start-postgres.sh); executed, it stops the server on exit" >&2
fi
