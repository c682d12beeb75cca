#!/usr/bin/env bash
# infra/engines/down.sh [--wipe]: stop the three engines up.sh started (each by its recorded PID,
# after checking the command line is ours), in parallel, and remove the env file.
# --wipe also deletes their data. Idempotent; exits 1 if any engine could not be stopped.
set -euo pipefail
ENGINE=engines-down
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
t0="$(now)"
declare -A PIDS
for e in kafka cassandra postgres; do "$ENGINES_HERE/$e-down.sh" "$@" & PIDS[$e]=$!; done
FAILED=()
for e in kafka cassandra postgres; do wait "${PIDS[$e]}" || FAILED+=("$e"); done
rm -f "$ENGINES_DIR/engines.env"
(( ${#FAILED[@]} )) && die "could not stop: ${FAILED[*]}"
log "all stopped in $(since "$t0")s"
