#!/usr/bin/env bash
# `make run`: after scripts/services.sh up, makes sure a console superuser exists, then runs
# gunicorn (uvicorn workers), a Celery worker and Celery beat in the foreground. Ctrl-C or SIGTERM stops them all,
# and the Postgres and Redis this run started.
# `make run-ha` runs it too, after scripts/ha.sh up, with the cluster's environment (var/ha/env),
# TXHUB_SERVICES=scripts/ha.sh (stopped at the end instead) and TXHUB_BEATS=2.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="$ROOT/.venv/bin"
PORT="${TXHUB_PORT:-8000}"
SERVICES="${TXHUB_SERVICES:-scripts/services.sh}"
# The environment given here is the whole story: a var/ha/env left behind is not read.
export TXHUB_HA_ENV_FILE=""
mkdir -p var/run
# Event counters of every web and Celery process are summed from here at scrape time
# (prometheus-client's multiprocess mode); a new run starts them from zero.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$ROOT/var/metrics}"
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

# Loopback producers speak plain HTTP: web (which checks the URL) and workers must both see this.
export TXHUB_ALLOW_HTTP_CALLBACKS="${TXHUB_ALLOW_HTTP_CALLBACKS:-1}"
# Shown again in the banner below, once everything answers (not buried under start-up logs).
LOGIN="$("$BIN/python" manage.py ensure_superuser)"
# /metrics names every tenant's topics and groups, so it asks for a bearer token (or a console
# session; docs/decisions/0090). Unless one is given, the run uses var/metrics-token, written
# once, so a Prometheus configured with it keeps scraping across runs.
if [ -z "${TXHUB_METRICS_TOKEN:-}" ]; then
  if [ ! -s var/metrics-token ]; then
    (umask 077 && "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(32))' \
      >var/metrics-token.tmp && mv var/metrics-token.tmp var/metrics-token)
  fi
  TXHUB_METRICS_TOKEN="$(cat var/metrics-token)"
fi
export TXHUB_METRICS_TOKEN

pids=()
stop() {
  # Signals that arrive while stopping are ignored, not fatal: make forwards its SIGTERM to this
  # script after the process group got one, and the services must still be stopped.
  trap '' INT TERM
  trap - EXIT
  echo "[run] stopping txhub" >&2
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$SERVICES" down
}
trap stop INT TERM EXIT

# ASGI (docs/decisions/0024): each worker process reads requests on an event loop and runs Django
# in TXHUB_WEB_THREADS threads (settings); long polls wait on the loop, holding no thread.
# No access log unless TXHUB_ACCESS_LOG names a file ("-": the terminal): a line per request is
# hundreds a second under load, burying real errors, and cost ~5 % of the web CPU (decision 0027).
access_log=()
if [ -n "${TXHUB_ACCESS_LOG:-}" ]; then access_log=(--access-logfile "$TXHUB_ACCESS_LOG"); fi
"$BIN/gunicorn" txhub.asgi:application --bind "127.0.0.1:$PORT" \
  --worker-class txhub.worker.TxhubWorker --workers "${TXHUB_WEB_WORKERS:-2}" \
  "${access_log[@]}" --graceful-timeout 10 --preload &
pids+=($!)
# The RocketMQ 5 gRPC door (apps/broker/grpc): TXHUB_GRPC_PROCESSES processes share the port
# (SO_REUSEPORT), as gunicorn's workers share the web port.
GRPC_PORT="${TXHUB_GRPC_PORT:-8081}"
for _ in $(seq 1 "${TXHUB_GRPC_PROCESSES:-2}"); do
  TXHUB_GRPC_PORT="$GRPC_PORT" "$BIN/python" manage.py grpcserver &
  pids+=($!)
done
# Scans on the default queue; producers' check calls on "callbacks", in a worker of their own, so
# a slow producer never delays a scan (docs/decisions/0009).
export TXHUB_CALLBACK_CONCURRENCY="${TXHUB_CALLBACK_CONCURRENCY:-8}"
"$BIN/celery" -A txhub worker --loglevel INFO --concurrency "${TXHUB_WORKER_CONCURRENCY:-4}" \
  -Q celery -n "scans@%h" &
pids+=($!)
"$BIN/celery" -A txhub worker --loglevel INFO --concurrency "$TXHUB_CALLBACK_CONCURRENCY" \
  -Q callbacks -n "callbacks@%h" &
pids+=($!)
# Beat's "Sending due task" lines (several a second) are DEBUG chatter; warnings still show.
# More than one beat is safe, as on every machine of a cluster: each scan claims its rows
# (docs/decisions/0044), so a second beat only triggers scans that find nothing to do.
for n in $(seq 1 "${TXHUB_BEATS:-1}"); do
  schedule=var/run/celerybeat-schedule
  [ "$n" = 1 ] || schedule="$schedule-$n"
  "$BIN/celery" -A txhub beat --loglevel "${TXHUB_BEAT_LOG_LEVEL:-WARNING}" --schedule "$schedule" &
  pids+=($!)
done

# The banner is the last thing printed before traffic: after the API answers and the workers
# reply to a ping.
for _ in $(seq 1 120); do
  if "$BIN/python" - "$PORT" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1).read()
PY
  sleep 0.5
done
"$BIN/celery" -A txhub inspect ping --timeout 10 >/dev/null 2>&1 || true
cat >&2 <<BANNER

  txhub is running
    API       http://127.0.0.1:$PORT/api/v1/     (docs: http://127.0.0.1:$PORT/api/docs/)
    RocketMQ  127.0.0.1:$GRPC_PORT (gRPC, apache.rocketmq.v2; credentials: POST /api/v1/tokens)
    console   http://127.0.0.1:$PORT/console/    (admin: http://127.0.0.1:$PORT/admin/)
    metrics   http://127.0.0.1:$PORT/metrics     (Authorization: Bearer $TXHUB_METRICS_TOKEN)
    login     ${LOGIN//$'\n'/$'\n'              }
    Ctrl-C stops everything.

BANNER
# Whichever process ends first ends the run: a half-running txhub is worse than a stopped one.
wait -n
