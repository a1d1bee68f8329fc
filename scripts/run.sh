#!/usr/bin/env bash
# `make run`: after scripts/services.sh up, makes sure a console superuser exists, then runs
# gunicorn, a Celery worker and Celery beat in the foreground. Ctrl-C or SIGTERM stops them all,
# and the Postgres and Redis this run started.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="$ROOT/.venv/bin"
PORT="${TXHUB_PORT:-8000}"
mkdir -p var/run
# Event counters of every web and Celery process are summed from here at scrape time
# (prometheus-client's multiprocess mode); a new run starts them from zero.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$ROOT/var/metrics}"
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

# Its line (with a new password, once) goes into the banner, printed when everything is ready.
login="$("$BIN/python" manage.py ensure_superuser)"
# Each Celery worker touches a file here when it is ready (txhub/celery.py), for the banner.
export TXHUB_READY_DIR="$ROOT/var/run/ready"
rm -rf "$TXHUB_READY_DIR" && mkdir -p "$TXHUB_READY_DIR"

pids=()
stop() {
  trap - INT TERM EXIT
  echo "[run] stopping txhub" >&2
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/services.sh down
}
trap stop INT TERM EXIT

"$BIN/gunicorn" txhub.wsgi:application --bind "127.0.0.1:$PORT" \
  --worker-class gthread --workers "${TXHUB_WEB_WORKERS:-2}" --threads "${TXHUB_WEB_THREADS:-16}" \
  --access-logfile "${TXHUB_ACCESS_LOG:--}" --graceful-timeout 10 &
pids+=($!)
# Scans on the default queue; producers' check calls on "callbacks", in a worker of their own, so
# a slow producer never delays a scan (docs/decisions/0009). Loopback producers speak plain HTTP.
export TXHUB_ALLOW_HTTP_CALLBACKS="${TXHUB_ALLOW_HTTP_CALLBACKS:-1}"
export TXHUB_CALLBACK_CONCURRENCY="${TXHUB_CALLBACK_CONCURRENCY:-8}"
# -q: no ASCII banners; per-task and beat lines are at WARNING (settings.LOGGING), so an idle
# txhub prints nothing and errors stand out.
"$BIN/celery" -A txhub -q worker --loglevel INFO --concurrency "${TXHUB_WORKER_CONCURRENCY:-4}" \
  -Q celery -n "scans@%h" &
pids+=($!)
"$BIN/celery" -A txhub -q worker --loglevel INFO --concurrency "$TXHUB_CALLBACK_CONCURRENCY" \
  -Q callbacks -n "callbacks@%h" &
pids+=($!)
"$BIN/celery" -A txhub -q beat --loglevel INFO --schedule var/run/celerybeat-schedule &
pids+=($!)

# The banner is the last thing printed before traffic: after /healthz answers and both workers
# are ready (up to 60 s; a process that dies first ends the run below anyway).
for _ in $(seq 600); do
  if [ "$(ls "$TXHUB_READY_DIR" | wc -l)" -ge 2 ] \
    && "$BIN/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" \
      "http://127.0.0.1:$PORT/healthz" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
{
  echo "[run] txhub is ready on http://127.0.0.1:$PORT"
  echo "[run]   console:  http://127.0.0.1:$PORT/console/   ${login//$'\n'/$'\n'[run]   }"
  echo "[run]   API docs: http://127.0.0.1:$PORT/api/docs/   admin: http://127.0.0.1:$PORT/admin/"
} >&2
# Whichever process ends first ends the run: a half-running txhub is worse than a stopped one.
wait -n
