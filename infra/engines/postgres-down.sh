#!/usr/bin/env bash
# infra/engines/postgres-down.sh [--wipe]: stop the server postgres-up.sh started, by the PID in its
# postmaster.pid, after checking that the process's command line carries this data folder (never
# by name, never another cluster). SIGINT = PostgreSQL's "fast" shutdown (rolls back open
# transactions, disconnects clients, checkpoints); SIGQUIT ("immediate", crash recovery on the
# next start) after FANOUT_ENGINES_STOP_TIMEOUT seconds (default 30). Idempotent.
# --wipe also deletes the data folder.
set -euo pipefail
ENGINE=postgres-down
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
BASE="$ENGINES_DIR/postgres"; DATA="$BASE/data"
TIMEOUT="${FANOUT_ENGINES_STOP_TIMEOUT:-30}"
PID="$( [[ -s "$DATA/postmaster.pid" ]] && head -1 "$DATA/postmaster.pid" || true)"
if [[ -z "$PID" ]]; then
  log "not running (no $DATA/postmaster.pid)"
elif ! cmdline_has "$PID" "-D $DATA "; then
  log "pid $PID is gone or is not our postmaster: nothing to stop"
else
  t0="$(now)"
  kill -INT "$PID"
  for ((i = 0; i < TIMEOUT * 10; i++)); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$PID" 2>/dev/null; then
    log "pid $PID still alive after ${TIMEOUT}s: immediate shutdown (SIGQUIT)"; kill -QUIT "$PID" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  fi
  kill -0 "$PID" 2>/dev/null && die "pid $PID did not stop"
  log "stopped pid $PID in $(since "$t0")s"
fi
rm -f "$BASE/postgres.pid"
if [[ "${1:-}" == --wipe ]]; then rm -rf "$DATA"; log "wiped $DATA"; fi
