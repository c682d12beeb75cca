#!/usr/bin/env bash
# infra/engines/kafka-down.sh [--wipe]: stop the broker kafka-up.sh started, by the PID it recorded,
# after checking that the process's command line is our kafka.Kafka with this folder's config
# (never by name). SIGTERM (controlled shutdown), SIGKILL after FANOUT_ENGINES_STOP_TIMEOUT
# seconds (default 30). Idempotent. --wipe also deletes the broker's data (topics, cluster id).
set -euo pipefail
ENGINE=kafka-down
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
BASE="$ENGINES_DIR/kafka"
stop_pid "$BASE/kafka.pid" "kafka.Kafka $BASE/config/server.properties" "${FANOUT_ENGINES_STOP_TIMEOUT:-30}"
if [[ "${1:-}" == --wipe ]]; then rm -rf "$BASE/data" "$BASE/cluster.id"; log "wiped $BASE/data"; fi
