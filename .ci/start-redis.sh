#!/usr/bin/env bash
# Start a throwaway Redis server for the tests and export EVENTSTORE_TEST_REDIS_URL.
#
# Source it (`. .ci/start-redis.sh`) so the variables and the stop trap land in the caller's
# shell; .ci/run does. Installs Debian's redis-server when it is missing (as root, as CI and
# the dev machines run), starts it on 127.0.0.1 on a free port in a fresh temp dir with the
# AOF on (`appendonly yes`, `appendfsync everysec`), and stops it and removes the dir in an
# EXIT trap chained onto the caller's. Also exports EVENTSTORE_TEST_REDIS_SERVER (the
# redis-server binary) so tests can start servers of their own (the restart tests do).
# Optional: EVENTSTORE_REDIS_PORT (default 56400 + a few tries upward if taken).
# Honours an already exported EVENTSTORE_TEST_REDIS_URL: then it starts nothing.

_es_redis_main() {
    if [ -n "${EVENTSTORE_TEST_REDIS_URL:-}" ]; then
        echo "start-redis: using the server at the given EVENTSTORE_TEST_REDIS_URL" >&2
        return 0
    fi
    local server
    server=$(command -v redis-server || true)
    if [ -z "$server" ]; then
        echo "start-redis: installing Debian's redis-server" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null && apt-get install -y -qq redis-server >/dev/null || return 1
        server=$(command -v redis-server) || return 1
    fi
    # Debian's package may start its own server on 6379 (not under systemd-less CI); we
    # never use it.
    local d
    d=$(mktemp -d /tmp/eventstore-redis.XXXXXX) || return 1
    local port="${EVENTSTORE_REDIS_PORT:-56400}" tries=0
    while :; do
        "$server" --port "$port" --bind 127.0.0.1 --dir "$d" --daemonize yes \
            --pidfile "$d/redis.pid" --logfile "$d/redis.log" --save "" \
            --unixsocket "$d/redis.sock" --unixsocketperm 700 \
            --appendonly yes --appendfsync everysec >/dev/null 2>&1
        local up=0 i
        for i in $(seq 1 50); do
            if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG \
                && [ -s "$d/redis.pid" ]; then
                up=1
                break
            fi
            sleep 0.1
        done
        if [ "$up" = 1 ]; then
            break
        fi
        tries=$((tries + 1))
        if [ "$tries" -ge 20 ]; then
            cat "$d/redis.log" >&2
            return 1
        fi
        port=$((port + 1))
    done
    export EVENTSTORE_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
    export EVENTSTORE_TEST_REDIS_SERVER="$server" EVENTSTORE_REDIS_DIR="$d"
    export EVENTSTORE_TEST_REDIS_SOCKET="$d/redis.sock"
    # Chain onto any EXIT trap the caller already has: `trap -p` prints it shell-quoted,
    # so it is unquoted by the shell itself (eval of `set --`), never by sed.
    local prev=""
    eval "set -- $(trap -p EXIT)"
    if [ "$#" -ge 3 ]; then
        prev="$3"
    fi
    trap "redis-cli -h 127.0.0.1 -p $port shutdown nosave >/dev/null 2>&1; rm -rf '$d'; ${prev:-:}" EXIT
    echo "start-redis: $("$server" --version | awk '{print $3}') on 127.0.0.1:$port ($d)" >&2
}

_es_redis_main || { echo "start-redis: could not start Redis" >&2; return 1 2>/dev/null || exit 1; }
unset -f _es_redis_main
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "start-redis: source this script (. .ci/start-redis.sh); executed, it stops the server on exit" >&2
fi
