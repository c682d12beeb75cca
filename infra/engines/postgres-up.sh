#!/usr/bin/env bash
# infra/engines/postgres-up.sh: start (or reuse) a throwaway PostgreSQL server on 127.0.0.1 for
# fanout's event store (eventsourcing.postgres). Idempotent:
#   1. finds the server binaries (the newest /usr/lib/postgresql/*/bin, else PATH); when initdb is
#      missing and we are root, installs Debian's `postgresql` with apt-get (without letting the
#      package create and start its own cluster on 5432);
#   2. initdb once into $FANOUT_ENGINES_DIR/postgres/data as the `postgres` OS user when run as root
#      (initdb refuses root), as the calling user otherwise; trust auth, which covers local
#      sockets and 127.0.0.1 only, since the server listens on nothing else;
#   3. starts it unless the postmaster in postmaster.pid is alive and ours (its command line
#      carries this data folder), waits for pg_isready, creates the database if missing;
#   4. prints FANOUT_EVENT_STORE=postgresql://postgres@127.0.0.1:PORT/DB on stdout.
# On a failure it prints the log tail and exits 1.
#
# Settings (environment; see lib.sh for FANOUT_ENGINES_DIR/_START_TIMEOUT/_FRESH):
#   FANOUT_ENGINES_POSTGRES_PORT  default 15432
#   FANOUT_ENGINES_POSTGRES_DB    default fanout
#   FANOUT_ENGINES_POSTGRES_BIN   folder with initdb/pg_ctl/pg_isready/psql (default: found as above)
set -euo pipefail
ENGINE=postgres-up
# shellcheck source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

PORT="${FANOUT_ENGINES_POSTGRES_PORT:-15432}"
DB="${FANOUT_ENGINES_POSTGRES_DB:-fanout}"
BASE="$ENGINES_DIR/postgres"
DATA="$BASE/data"; LOG="$BASE/postgres.log"
PIDFILE="$BASE/postgres.pid"   # a copy of postmaster.pid's first line, for the down script and reports
TIMINGS="$BASE/timings"
MARK="-D $DATA "

find_bin() {
  local d
  if [[ -n "${FANOUT_ENGINES_POSTGRES_BIN:-}" ]]; then echo "$FANOUT_ENGINES_POSTGRES_BIN"; return 0; fi
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  [[ -n "$d" && -x "$d/initdb" ]] && { echo "$d"; return 0; }
  command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

mkdir -p "$BASE"
if ! B="$(find_bin)"; then
  [[ "$(id -u)" == 0 ]] || die "PostgreSQL server binaries not found; install them (apt-get install -y postgresql) or set FANOUT_ENGINES_POSTGRES_BIN"
  command -v apt-get >/dev/null || die "PostgreSQL server binaries not found and no apt-get here; set FANOUT_ENGINES_POSTGRES_BIN"
  t0="$(now)"
  log "initdb not found: installing postgresql with apt-get (log $BASE/apt.log)"
  # the package would create and try to start a 'main' cluster on 5432: we only want the binaries
  mkdir -p /etc/postgresql-common/createcluster.d
  echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/fanout-engines.conf
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql; } \
    > "$BASE/apt.log" 2>&1 || { tail_logs "$BASE/apt.log"; die "apt-get install postgresql failed"; }
  B="$(find_bin)" || die "postgresql installed but initdb still not found (see $BASE/apt.log)"
  took="$(since "$t0")"; record_timing "$TIMINGS" install_s "$took"; log "installed in ${took}s"
fi
for x in initdb pg_ctl pg_isready psql postgres; do [[ -x "$B/$x" ]] || die "$B/$x missing"; done

if [[ "$(id -u)" == 0 ]]; then
  PGUSER_OS=postgres
  id "$PGUSER_OS" >/dev/null 2>&1 || die "OS user postgres missing (initdb refuses to run as root; the postgresql package creates it)"
  as_pg() { runuser -u "$PGUSER_OS" -- "$@"; }
else
  PGUSER_OS="$(id -un)"
  as_pg() { "$@"; }
fi

url() { echo "FANOUT_EVENT_STORE=postgresql://postgres@127.0.0.1:$PORT/$DB"; }
postmaster_pid() { [[ -s "$DATA/postmaster.pid" ]] && head -1 "$DATA/postmaster.pid"; }
alive() { local p; p="$(postmaster_pid)" && cmdline_has "$p" "$MARK"; }
isready() { "$B/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -t 2; }
ensure_db() {
  local exists
  exists="$("$B/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -XtAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ||
    die "psql cannot reach 127.0.0.1:$PORT"
  if [[ "$exists" != 1 ]]; then
    "$B/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -Xqc "CREATE DATABASE \"$DB\"" >/dev/null
    log "created database $DB"
  fi
}
wait_ready() {
  local t0="$1"
  until isready; do
    alive || { tail_logs "$LOG"; die "PostgreSQL exited during start-up (log $LOG)"; }
    older_than "$t0" "$ENGINES_TIMEOUT" && { tail_logs "$LOG"; "$ENGINES_HERE/postgres-down.sh" || true; die "not ready after ${ENGINES_TIMEOUT}s"; }
    sleep 0.1
  done
}

if alive; then
  running_port="$(sed -n 4p "$DATA/postmaster.pid")"
  [[ "$running_port" == "$PORT" ]] || die "the server on $DATA already runs on port $running_port, not $PORT"
  wait_ready "$(now)"
  postmaster_pid > "$PIDFILE"
  log "already running (pid $(cat "$PIDFILE"), port $PORT)"
  record_timing "$TIMINGS" reused 1
  ensure_db; url; exit 0
fi
rm -f "$TIMINGS"
isready && die "port 127.0.0.1:$PORT is already served by another PostgreSQL (FANOUT_ENGINES_POSTGRES_PORT)"
port_open "$PORT" && die "port 127.0.0.1:$PORT is already in use by another process (FANOUT_ENGINES_POSTGRES_PORT)"

if [[ "${FANOUT_ENGINES_FRESH:-0}" == 1 ]]; then log "FANOUT_ENGINES_FRESH=1: wiping $DATA"; rm -rf "$DATA"; fi
if [[ "$(id -u)" == 0 ]]; then chown "$PGUSER_OS:" "$BASE"; chmod 0700 "$BASE"; fi
as_pg test -w "$BASE" || die "$BASE is not writable by $PGUSER_OS (is a parent folder 0700, e.g. under /root? set FANOUT_ENGINES_DIR)"

if [[ ! -f "$DATA/PG_VERSION" ]]; then
  t0="$(now)"
  # --no-sync skips only initdb's final fsync of the new files; the server itself runs with fsync on
  as_pg "$B/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-locale --no-sync > "$BASE/initdb.log" 2>&1 ||
    { tail_logs "$BASE/initdb.log"; die "initdb failed"; }
  echo "include_if_exists = 'fanout-engines.conf'" >> "$DATA/postgresql.conf"
  took="$(since "$t0")"; record_timing "$TIMINGS" initdb_s "$took"; log "initdb done in ${took}s ($DATA)"
fi
# rewritten on every start: the port may change between runs
as_pg tee "$DATA/fanout-engines.conf" > /dev/null <<EOF
# written by infra/engines/postgres-up.sh
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$BASE'
fsync = on
synchronous_commit = on
max_connections = 200
shared_buffers = 128MB
logging_collector = off
log_min_messages = warning
EOF

t0="$(now)"
as_pg "$B/pg_ctl" -D "$DATA" -l "$LOG" -w -t "$ENGINES_TIMEOUT" start > /dev/null ||
  { tail_logs "$LOG"; die "pg_ctl start failed (log $LOG)"; }
wait_ready "$t0"
postmaster_pid > "$PIDFILE"
took="$(since "$t0")"; record_timing "$TIMINGS" start_to_ready_s "$took"
log "ready on 127.0.0.1:$PORT after ${took}s (pid $(cat "$PIDFILE"), $("$B/postgres" --version), log $LOG)"
ensure_db
url
