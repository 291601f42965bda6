#!/usr/bin/env bash
# A real Neo4j 5 (Community, embedded DBMS with the Bolt connector) for development and tests.
#
#   scripts/neo4j.sh start          build on first use (Maven Central), start, wait for Bolt; prints the URL
#   scripts/neo4j.sh stop           stop the server started by `start`
#   scripts/neo4j.sh status         say whether it runs (exit 0) or not (exit 3)
#   scripts/neo4j.sh url            print the URL (with the dev credentials) for ETSTORE_TEST_NEO4J
#   scripts/neo4j.sh with CMD...    run CMD with ETSTORE_TEST_NEO4J set, starting the server if needed and
#                                   stopping it afterwards (even when CMD fails); without java or mvn,
#                                   runs CMD as is and the Neo4j test cases skip, saying why
#
# Listens on 127.0.0.1:$ETSTORE_NEO4J_PORT (7687). State (data, log, pid, the generated dev password)
# lives in $ETSTORE_NEO4J_HOME (./.neo4j). Needs Java 17 and Maven 3.8+. The server refuses
# LOAD CSV from file:/// URLs and has no plugins (see scripts/neo4j-server).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/scripts/neo4j-server"
HOME_DIR="${ETSTORE_NEO4J_HOME:-$ROOT/.neo4j}"
PORT="${ETSTORE_NEO4J_PORT:-7687}"
HOST=127.0.0.1
HEAP="${ETSTORE_NEO4J_HEAP:-2g}"
PIDFILE="$HOME_DIR/server.pid"
LOG="$HOME_DIR/server.log"
PWFILE="$HOME_DIR/password"

say() { echo "neo4j.sh: $*" >&2; }

have_tools() { command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; }

running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

url() { echo "neo4j://neo4j:$(cat "$PWFILE")@$HOST:$PORT"; }

port_open() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }

build() {
    local stamp="$SRC/target/.built"
    if [[ -f "$stamp" && "$stamp" -nt "$SRC/pom.xml" && -z "$(find "$SRC/src" -newer "$stamp" -print -quit)" ]]; then
        return
    fi
    say "building the Neo4j launcher (first run downloads Neo4j Community from Maven Central)..."
    mvn -q -B -Dstyle.color=never -f "$SRC/pom.xml" package -DskipTests >&2
    touch "$stamp"
}

start() {
    if running; then
        say "already running (pid $(cat "$PIDFILE"))"
        url
        return
    fi
    have_tools || { say "java and mvn are needed (Java 17, Maven 3.8+)"; exit 2; }
    if port_open; then
        say "port $PORT on $HOST is taken by another process; set ETSTORE_NEO4J_PORT"
        exit 1
    fi
    build
    mkdir -p "$HOME_DIR/data"
    if [[ ! -s "$PWFILE" ]]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$PWFILE")
    fi
    : >"$LOG"
    ETSTORE_NEO4J_DEV_PASSWORD="$(cat "$PWFILE")" nohup java "-Xmx$HEAP" -XX:+UseG1GC \
        -cp "$SRC/target/classes:$SRC/target/lib/*" etstore.dev.Neo4jDevServer \
        "$HOME_DIR/data" "$HOST" "$PORT" >>"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    local waited=0
    until grep -q '^READY' "$LOG"; do
        if ! running; then
            say "the server exited during start-up; last lines of $LOG:"
            tail -n 20 "$LOG" >&2
            rm -f "$PIDFILE"
            exit 1
        fi
        if ((waited >= 180)); then
            say "no Bolt answer after ${waited}s; see $LOG"
            stop
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    say "Neo4j is up on bolt://$HOST:$PORT after ${waited}s (pid $(cat "$PIDFILE"))"
    url
}

stop() {
    if ! running; then
        rm -f "$PIDFILE"
        say "not running"
        return
    fi
    local pid
    pid="$(cat "$PIDFILE")"
    kill -TERM "$pid"
    for _ in $(seq 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "pid $pid ignored SIGTERM for 60s; killing it"
        kill -KILL "$pid"
    fi
    rm -f "$PIDFILE"
    say "stopped"
}

with() {
    if ! have_tools; then
        say "java or mvn not found: the Neo4j contract cases will skip (install JDK 17 and Maven 3.8+)"
        "$@"
        return
    fi
    local started=0
    if ! running; then
        start >/dev/null
        started=1
    fi
    local rc=0
    if ((started)); then
        trap 'stop' EXIT
    fi
    ETSTORE_TEST_NEO4J="$(url)" "$@" || rc=$?
    return "$rc"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
    if running; then
        say "running (pid $(cat "$PIDFILE")) on bolt://$HOST:$PORT"
    else
        say "not running"
        exit 3
    fi
    ;;
url)
    [[ -s "$PWFILE" ]] || { say "never started here: run scripts/neo4j.sh start"; exit 1; }
    url
    ;;
with)
    shift
    [[ $# -gt 0 ]] || { say "usage: scripts/neo4j.sh with CMD..."; exit 2; }
    with "$@"
    ;;
*)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
