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
# Python's bytecode caches, even where the environment turns them off: the run starts hundreds of
# Python processes (servers, workers, commands), each of which would compile txhub's modules
# again, and pytest would rewrite every test module's asserts again in each of its processes.
unset PYTHONDONTWRITEBYTECODE
# Each test process has Redis databases and a test database of its own, never `make run`'s
# (tests/support/workers.py), so a test run beside a running `make run` leaves it alone.
status=0
if [ "$#" -gt 0 ]; then
  .venv/bin/pytest "$@" || status=$?
else
  # Two runs (docs/decisions/0051): everything but `perf` in a few processes at once, then the
  # tests that assert a time or a rate, alone, so another test's load is not in their figures.
  # Four workers (docs/decisions/0060), each with three Redis databases of its own from 5 on: a
  # Redis started before services.sh asked for 32 databases has room for three.
  workers="${TXHUB_TEST_WORKERS:-4}"
  databases="$(redis-cli -h 127.0.0.1 -p "${TXHUB_REDIS_PORT:-63799}" config get databases | tail -n 1)"
  if [ $(((databases - 5) / 3)) -lt "$workers" ]; then
    workers=$(((databases - 5) / 3))
  fi
  .venv/bin/pytest -n "$workers" --dist loadfile -m "not perf" || status=$?
  .venv/bin/pytest -m perf tests/e2e || status=$?
fi
[ "$was_running" = 1 ] || scripts/services.sh down
exit "$status"
