#!/usr/bin/env bash
# infra/engines/cassandra-down.sh [--wipe]: stop the node cassandra-up.sh started, by the PID it
# recorded, after checking that the process's command line carries this folder's
# -Dcassandra.config (never by name). SIGTERM (clean shutdown, flushes memtables, about 6 s),
# SIGKILL after FANOUT_ENGINES_STOP_TIMEOUT seconds (default 30). Idempotent.
# --wipe also deletes the node's data.
set -euo pipefail
ENGINE=cassandra-down
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
BASE="$ENGINES_DIR/cassandra"
stop_pid "$BASE/cassandra.pid" "-Dcassandra.config=file://$BASE/conf/cassandra.yaml " "${FANOUT_ENGINES_STOP_TIMEOUT:-30}"
if [[ "${1:-}" == --wipe ]]; then rm -rf "$BASE/data"; log "wiped $BASE/data"; fi
