#!/usr/bin/env bash
# infra/browser/chromium-up.sh: make sure Debian's chromium is installed for the reviewer console's
# browser tests (tests/e2e/test_console_browser.py drives /usr/bin/chromium with Playwright; no
# browser is ever downloaded by Playwright). Like infra/engines/postgres-up.sh for PostgreSQL: when
# it is missing and we are root, `apt-get install chromium chromium-driver`; otherwise one line that
# says what to do, and exit 1 (the tests would fail loudly anyway: they never skip).
# Settings: FANOUT_CHROMIUM (default /usr/bin/chromium), FANOUT_ENGINES_DIR for the apt log.
set -euo pipefail
CHROMIUM="${FANOUT_CHROMIUM:-/usr/bin/chromium}"
LOGDIR="${FANOUT_ENGINES_DIR:-/tmp/fanout-engines}"
[[ -x "$CHROMIUM" ]] && exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "chromium-up: $CHROMIUM not found; install it (apt-get install -y chromium chromium-driver)" >&2
  exit 1
fi
mkdir -p "$LOGDIR"
echo "chromium-up: $CHROMIUM not found: installing chromium with apt-get (log $LOGDIR/chromium-apt.log)" >&2
t0=$(date +%s)
{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver; } \
  > "$LOGDIR/chromium-apt.log" 2>&1 || { tail -20 "$LOGDIR/chromium-apt.log" >&2; echo "chromium-up: apt-get install chromium failed" >&2; exit 1; }
[[ -x "$CHROMIUM" ]] || { echo "chromium-up: chromium installed but $CHROMIUM is still missing" >&2; exit 1; }
echo "chromium-up: installed in $(( $(date +%s) - t0 )) s" >&2
