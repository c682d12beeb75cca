# shellcheck shell=bash disable=SC2034
# Helpers shared by infra/engines/*.sh (sourced, not run). The caller sets ENGINE (a short name
# used in log lines) before sourcing.
#
# Settings (environment):
#   FANOUT_ENGINES_CACHE          jars and the Maven repo   (default $HOME/.cache/fanout-engines)
#   FANOUT_ENGINES_DIR            data, pids, logs, env file (default /tmp/fanout-engines)
#   FANOUT_ENGINES_START_TIMEOUT  seconds an engine gets to become ready (default 180)
#   FANOUT_ENGINES_FRESH=1        wipe the engine's data before starting
# Note: fanout/config.py refuses unknown FANOUT_* variables; these FANOUT_ENGINES_* ones are read
# by the scripts only. Do not export them into a `fanout` process until config.py knows the prefix.

ENGINES_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ENGINES_CACHE="${FANOUT_ENGINES_CACHE:-${HOME:-/root}/.cache/fanout-engines}"
ENGINES_DIR="${FANOUT_ENGINES_DIR:-/tmp/fanout-engines}"
ENGINES_TIMEOUT="${FANOUT_ENGINES_START_TIMEOUT:-180}"
ENGINES_M2="$ENGINES_CACHE/m2"

log() { printf '%s: %s\n' "${ENGINE:-engines}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
# since T0 -> seconds elapsed, one decimal
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
# older_than T0 SECONDS -> true once SECONDS have passed since T0
older_than() { awk -v a="$1" -v b="$(now)" -v t="$2" 'BEGIN{exit !(b-a>t)}'; }
# port_open PORT [HOST] -> true if something accepts TCP connections there
port_open() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }
# cmdline_has PID STRING -> true if PID is alive and its argv (joined by spaces) contains STRING
cmdline_has() {
  [[ -n "${1:-}" && -r "/proc/$1/cmdline" ]] && kill -0 "$1" 2>/dev/null &&
    tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}
# record_timing FILE KEY VALUE: one key=value per line, the latest value wins
record_timing() {
  local f="$1" k="$2" v="$3"
  mkdir -p "$(dirname "$f")"; touch "$f"
  { grep -v "^$k=" "$f" || true; echo "$k=$v"; } > "$f.tmp"; mv -f "$f.tmp" "$f"
}
# tail_logs FILE...: the last lines of each existing file, to stderr
tail_logs() {
  local f
  for f in "$@"; do
    [[ -s "$f" ]] || continue
    echo "----- last 40 lines of $f -----" >&2; tail -n 40 "$f" >&2
  done
}

# pick_java MIN MAX -> path of a java whose feature version is within [MIN, MAX].
# JAVA_HOME first, then the JDK 17 of Debian, then any JDK under /usr/lib/jvm, then PATH.
pick_java() {
  local min="$1" max="$2" c v
  for c in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} /usr/lib/jvm/java-17-openjdk-amd64/bin/java \
           /usr/lib/jvm/*/bin/java "$(command -v java || true)"; do
    [[ -x "$c" ]] || continue
    v="$("$c" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
    v="${v#1.}"
    [[ "$v" =~ ^[0-9]+$ ]] && (( v >= min && v <= max )) && { echo "$c"; return 0; }
  done
  return 1
}

# maven_fetch POM LIBDIR MARKER_JAR [-Dprop=value...]
# Copies the runtime dependencies of POM into LIBDIR (atomically: LIBDIR.tmp then rename), with the
# Maven repo in the cache. Serialised by a lock on the cache, so parallel ups share one Maven repo.
# Prints the time taken on stderr and records it as fetch_s in $TIMINGS (if set).
maven_fetch() {
  local pom="$1" lib="$2" marker="$3"; shift 3
  [[ -f "$lib/.complete" ]] && return 0
  mkdir -p "$ENGINES_CACHE"
  exec 9> "$ENGINES_CACHE/.fetch.lock"
  flock 9
  if [[ -f "$lib/.complete" ]]; then exec 9>&-; return 0; fi   # another up fetched it meanwhile
  command -v mvn >/dev/null || die "mvn not found and $lib not cached (apt-get install -y maven)"
  local t0 flog="$lib.fetch.log"; t0="$(now)"
  log "fetching $(basename "$lib") from Maven Central into $lib (Maven repo $ENGINES_M2)"
  rm -rf "$lib.tmp"; mkdir -p "$lib.tmp"
  # -q -B still prints ANSI codes; keep Maven's output in a file and show its tail on failure.
  if ! mvn -B -Dstyle.color=never -f "$pom" -Dmaven.repo.local="$ENGINES_M2" "$@" \
        -DoutputDirectory="$lib.tmp" -DincludeScope=runtime dependency:copy-dependencies > "$flog" 2>&1; then
    tail_logs "$flog"; exec 9>&-; die "Maven fetch failed (full log: $flog)"
  fi
  [[ -f "$lib.tmp/$marker" ]] || { exec 9>&-; die "$marker missing after the fetch (log: $flog)"; }
  touch "$lib.tmp/.complete"; rm -rf "$lib"; mv "$lib.tmp" "$lib"
  exec 9>&-
  local took; took="$(since "$t0")"
  log "fetched $(find "$lib" -name '*.jar' | wc -l) jars, $(du -sh "$lib" | cut -f1), in ${took}s"
  [[ -n "${TIMINGS:-}" ]] && record_timing "$TIMINGS" fetch_s "$took"
  return 0
}

# start_bg PIDFILE LOGFILE CMD...: start CMD in its own session, detached, and record the PID of
# CMD itself (the inner bash writes its own PID and then execs CMD, so no wrapper remains).
start_bg() {
  local pidfile="$1" out="$2"; shift 2
  rm -f "$pidfile"
  nohup setsid bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" > "$out" 2>&1 < /dev/null &
  local i
  for i in $(seq 1 100); do [[ -s "$pidfile" ]] && return 0; sleep 0.05; done
  die "no PID file written at $pidfile"
}

# stop_pid PIDFILE CMDLINE_MARK TIMEOUT [SIG]: signal the recorded PID only if its command line
# carries CMDLINE_MARK (so a recycled PID is never hit), wait, SIGKILL after TIMEOUT seconds.
stop_pid() {
  local pidfile="$1" mark="$2" timeout="$3" sig="${4:-TERM}" pid i
  if [[ ! -s "$pidfile" ]]; then log "not running (no PID file $pidfile)"; return 0; fi
  pid="$(cat "$pidfile")"
  if ! cmdline_has "$pid" "$mark"; then
    log "pid $pid is gone or is not ours: removing stale $pidfile"; rm -f "$pidfile"; return 0
  fi
  local t0; t0="$(now)"
  kill "-$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid still alive after ${timeout}s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
  log "stopped pid $pid in $(since "$t0")s"
}
