#!/usr/bin/env bash
# infra/engines/check.sh (make engines-check): start the three engines (up.sh), run the smoke
# checks with the real clients (smoke.py), report fetch/format/start-to-ready times and the RSS
# of each engine (idle after start, and after the checks), then stop them (down.sh), always,
# even when a check fails. Exits 1 if an engine did not start or a check failed.
#   PY                         python with the distributed extras (default .venv/bin/python)
#   FANOUT_ENGINES_CHECK_KEEP=1  leave the engines running afterwards
# Engines already running are reused (their start time is then not measured) and still stopped
# at the end. The report is also written to $FANOUT_ENGINES_DIR/check-report.txt.
set -euo pipefail
ENGINE=engines-check
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
PY="${PY:-.venv/bin/python}"
REPORT="$ENGINES_DIR/check-report.txt"
mkdir -p "$ENGINES_DIR"

rss_kb() {  # rss_kb PID... -> summed VmRSS in kB
  local p s=0 v
  for p in "$@"; do v="$(awk '/^VmRSS:/{print $2}' "/proc/$p/status" 2>/dev/null || echo 0)"; s=$((s + ${v:-0})); done
  echo "$s"
}
pss_kb() {  # pss_kb PID... -> summed Pss in kB (shared pages counted once overall)
  local p s=0 v
  for p in "$@"; do v="$(awk '/^Pss:/{print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)"; s=$((s + ${v:-0})); done
  echo "$s"
}
mb() { awk -v k="$1" 'BEGIN{printf "%.0f MB", k/1024}'; }
pids_of() {  # the engine's PIDs: the JVM, or the postmaster and its children
  case "$1" in
    kafka) cat "$ENGINES_DIR/kafka/kafka.pid" 2>/dev/null || true;;
    cassandra) cat "$ENGINES_DIR/cassandra/cassandra.pid" 2>/dev/null || true;;
    postgres) local pm; pm="$(cat "$ENGINES_DIR/postgres/postgres.pid" 2>/dev/null || true)"
              [[ -n "$pm" ]] && { echo "$pm"; pgrep -P "$pm" || true; };;
  esac
}
memline() {  # memline LABEL
  local e pids
  for e in postgres kafka cassandra; do
    mapfile -t pids < <(pids_of "$e")
    if [[ "$e" == postgres ]]; then
      printf '  %-10s %-22s RSS %s summed over %d processes (PSS %s)\n' "$e" "$1" "$(mb "$(rss_kb "${pids[@]}")")" "${#pids[@]}" "$(mb "$(pss_kb "${pids[@]}")")"
    else
      printf '  %-10s %-22s RSS %s (pid %s)\n' "$e" "$1" "$(mb "$(rss_kb "${pids[@]}")")" "${pids[*]}"
    fi
  done
}
timing() { grep "^$2=" "$ENGINES_DIR/$1/timings" 2>/dev/null | cut -d= -f2 || true; }

cleanup() {
  local rc=$?
  if [[ "${FANOUT_ENGINES_CHECK_KEEP:-0}" == 1 ]]; then log "FANOUT_ENGINES_CHECK_KEEP=1: leaving the engines running"
  else
    local t0; t0="$(now)"
    "$ENGINES_HERE/down.sh" || rc=1
    echo "engines-down: $(since "$t0")s" | tee -a "$REPORT"
  fi
  exit "$rc"
}
trap cleanup EXIT

: > "$REPORT"
{ echo "engines-check $(date -u +%FT%TZ) on $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cache $ENGINES_CACHE ($(du -sh "$ENGINES_CACHE" 2>/dev/null | cut -f1 || echo empty) before), engines dir $ENGINES_DIR"; } | tee -a "$REPORT"
t0="$(now)"
"$ENGINES_HERE/up.sh"
UP="$(since "$t0")"
IDLE="$(memline "idle after start")"
t0="$(now)"
SMOKE_RC=0
"$PY" "$ENGINES_HERE/smoke.py" | tee "$ENGINES_DIR/smoke.log" || SMOKE_RC=$?
SMOKE="$(since "$t0")"
{
  echo "engines-up (all three, in parallel): ${UP}s"
  for e in postgres kafka cassandra; do
    line="  $e:"
    [[ -n "$(timing "$e" reused)" ]] && line+=" already running (reused; start not measured)"
    for k in install_s fetch_s initdb_s format_s start_to_ready_s; do
      v="$(timing "$e" "$k")"; [[ -n "$v" ]] && line+=" ${k%_s}=${v}s"
    done
    echo "$line"
  done
  echo "memory:"
  echo "$IDLE"
  memline "after the smoke checks"
  echo "smoke checks: ${SMOKE}s, $( ((SMOKE_RC == 0)) && echo passed || echo FAILED)"
  grep -E '^\[[a-z]+\] (OK|FAIL)' "$ENGINES_DIR/smoke.log" | sed 's/^/  /' || true
  echo "cache after: $(du -sh "$ENGINES_CACHE" | cut -f1) ($(du -sh "$ENGINES_CACHE/m2" 2>/dev/null | cut -f1) Maven repo)"
} | tee -a "$REPORT"
(( SMOKE_RC == 0 )) || { log "smoke checks failed (see above)"; exit 1; }
