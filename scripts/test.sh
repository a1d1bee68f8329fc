#!/usr/bin/env bash
# `make test`: set everything up, run the whole suite on real services, and stop again the
# services this run started (a running `make run` keeps its own).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
was_running=0
if command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p "${TXHUB_REDIS_PORT:-63799}" ping >/dev/null 2>&1; then
  was_running=1
fi
scripts/services.sh up
# The tests' producers listen on http://127.0.0.1 (refused in production by default).
export TXHUB_ALLOW_HTTP_CALLBACKS="${TXHUB_ALLOW_HTTP_CALLBACKS:-1}"
# The tests use the local services above, even while `make run-ha` runs (var/ha/env is not read).
export TXHUB_HA_ENV_FILE=""
# The tests' cache (rate limits, the configuration epoch) is Redis database 4, not `make run`'s 3:
# a test run beside a running `make run` neither resets its epoch nor shares its counters.
export TXHUB_CACHE_URL="${TXHUB_CACHE_URL:-redis://127.0.0.1:${TXHUB_REDIS_PORT:-63799}/4}"
status=0
.venv/bin/pytest "$@" || status=$?
[ "$was_running" = 1 ] || scripts/services.sh down
exit "$status"
