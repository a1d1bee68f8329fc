#!/usr/bin/env bash
# Sets up and starts txhub's local services: Debian packages, the venv, a Postgres cluster and a
# Redis server under var/, both on 127.0.0.1 and private ports. Idempotent: safe to run again.
#
#   scripts/services.sh up      install what is missing, start Postgres + Redis, migrate
#   scripts/services.sh down    stop the Postgres + Redis started from this checkout
#   scripts/services.sh prepare install what is missing, write the keys; start nothing
#   scripts/services.sh restart-postgres [--immediate]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="$ROOT/var"
PY="${TXHUB_PYTHON:-python3.11}"
VENV="$ROOT/.venv"
PG_PORT="${TXHUB_PG_PORT:-54329}"
REDIS_PORT="${TXHUB_REDIS_PORT:-63799}"
PG_USER_OS="${TXHUB_PG_OS_USER:-txhub-pg}"   # Postgres refuses to run as root
PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
# These are the local services: manage.py below must not follow a running `make run-ha`'s env.
export TXHUB_HA_ENV_FILE=""

log() { printf '[services] %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_debian_packages() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  [ -n "$PG_BIN" ] && [ -x "$PG_BIN/pg_ctl" ] || missing+=(postgresql)
  command -v "$PY" >/dev/null 2>&1 || missing+=(python3 python3-venv)
  command -v pgbench >/dev/null 2>&1 || [ -x "$PG_BIN/pgbench" ] || missing+=(postgresql-contrib)
  # The console's browser tests drive Debian's Chromium (Playwright never downloads a browser).
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  # The nightly reconciliation: PySpark needs Java 17 and reads Postgres with Debian's JDBC driver.
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  [ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
  # libfaketime: the chaos suite's clock-skew case (F12) runs Celery under it, and
  # tests/broker/test_checkback_clock.py a check-back worker of its own (decision 0102).
  compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(faketime)
  # The HA cases (F14-F19, tests/chaos/ha.py) run scripts/ha.sh: etcd, Redis Sentinels, and a
  # venv of Debian's python3 for Patroni.
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
  /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    # Their packages' own services are not wanted: scripts/ha.sh runs ours, on ports of its own.
    for unit in etcd redis-sentinel; do
      as_root systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
  fi
}

ensure_venv() {
  local stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/client/pyproject.toml" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  log "installing Python packages into .venv"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e "$ROOT[dev]" -e "$ROOT/client"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
}

# Runs a Postgres binary as the unprivileged OS user when we are root.
pg_run() {
  if [ "$(id -u)" = 0 ]; then runuser -u "$PG_USER_OS" -- "$@"; else "$@"; fi
}

pg_data_dir() {
  # var/pg unless the unprivileged user cannot reach this checkout (e.g. a clone under /root).
  if [ "$(id -u)" = 0 ] && ! runuser -u "$PG_USER_OS" -- test -x "$ROOT" 2>/dev/null; then
    echo "/var/tmp/txhub-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
  else
    echo "$VAR/pg"
  fi
}

pg_up() {
  if [ "$(id -u)" = 0 ] && ! id "$PG_USER_OS" >/dev/null 2>&1; then
    log "creating OS user $PG_USER_OS for Postgres"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER_OS"
  fi
  local data; data="$(pg_data_dir)"
  mkdir -p "$data"
  [ "$(id -u)" = 0 ] && chown "$PG_USER_OS" "$data" && chmod 700 "$data"
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initialising a Postgres cluster in $data"
    pg_run "$PG_BIN/initdb" -D "$data" -U txhub --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = ''
max_connections = 200
shared_buffers = 256MB
CONF
  fi
  if pg_run "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    log "Postgres already running on 127.0.0.1:$PG_PORT"
  else
    log "starting Postgres on 127.0.0.1:$PG_PORT"
    pg_run "$PG_BIN/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >/dev/null
  fi
  "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U txhub -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='txhub'" | grep -q 1 \
    || "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U txhub txhub
}

redis_up() {
  mkdir -p "$VAR/redis"
  if redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    log "Redis already running on 127.0.0.1:$REDIS_PORT"
    return 0
  fi
  log "starting Redis on 127.0.0.1:$REDIS_PORT"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes --dir "$VAR/redis" \
    --pidfile "$VAR/redis/redis.pid" --logfile "$VAR/redis/redis.log" \
    --appendonly yes --save "" --databases 32
  for _ in $(seq 50); do
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "Redis did not start; see var/redis/redis.log"; return 1
}

# A random SECRET_KEY for this checkout, made once and kept (0600): every process started from
# here (make run, make test, manage.py, the tests' gunicorn and Celery) reads it through
# txhub/settings.py. Production sets TXHUB_SECRET_KEY instead (check --deploy flags the file).
secret_key_up() {
  mkdir -p "$VAR"
  # var/secret-key: Django's SECRET_KEY; var/credentials-key: the key RocketMQ secret keys are
  # derived from (TXHUB_CREDENTIALS_KEY, docs/decisions/0036). Production sets both instead.
  for name in secret-key credentials-key; do
    [ -s "$VAR/$name" ] && continue
    log "writing a new random key to var/$name"
    (umask 077 && "$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(50))' \
      >"$VAR/$name.tmp" && mv "$VAR/$name.tmp" "$VAR/$name")
  done
}

down() {
  local data; data="$(pg_data_dir)"
  if [ -f "$data/PG_VERSION" ]; then
    pg_run "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 && log "Postgres stopped" || true
  fi
  redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 && log "Redis stopped" || true
}

case "${1:-up}" in
  up)
    ensure_debian_packages
    ensure_venv
    pg_up
    redis_up
    secret_key_up
    (cd "$ROOT" && "$VENV/bin/python" manage.py migrate --noinput -v 0)
    ;;
  # What `make run-ha` (scripts/ha.sh) needs of this script: packages, the venv, the keys.
  prepare)
    ensure_debian_packages
    ensure_venv
    secret_key_up
    ;;
  down) down ;;
  restart-postgres)
    # --immediate: stop like a crash (no shutdown checkpoint; WAL replay on start). Used by tests.
    mode=fast; [ "${2:-}" = "--immediate" ] && mode=immediate
    pg_run "$PG_BIN/pg_ctl" -D "$(pg_data_dir)" -m "$mode" -w stop >/dev/null
    pg_run "$PG_BIN/pg_ctl" -D "$(pg_data_dir)" -l "$(pg_data_dir)/server.log" -w -t 60 start >/dev/null
    ;;
  *) echo "usage: $0 up|prepare|down|restart-postgres [--immediate]" >&2; exit 2 ;;
esac
