#!/usr/bin/env bash
# `make run-ha`'s services (docs/decisions/0042, 0043): a three-node Postgres cluster managed by
# Patroni with etcd as its store, and Redis with a replica watched by three Sentinels, all on
# 127.0.0.1, data under var/ha/. Idempotent: safe to run again.
#
#   scripts/ha.sh up               install what is missing, start everything, migrate, write
#                                  var/ha/env (what settings.py and scripts/run.sh read)
#   scripts/ha.sh run              scripts/run.sh on the cluster (after up; `make run-ha`)
#   scripts/ha.sh down             stop everything started here, remove var/ha/env
#   scripts/ha.sh start-node N     start node N's Patroni again (1..3; it rejoins by itself)
#   scripts/ha.sh start-etcd|start-redis   start what of them is not running (chaos cases)
#   scripts/ha.sh patroni-venv     make Patroni's venv if missing; print its path
#
# Ports and the directory come from the environment (the chaos suite runs its own cluster on
# free ports): TXHUB_HA_DIR, TXHUB_HA_PG_PORTS, TXHUB_HA_REST_PORTS, TXHUB_HA_ETCD_PORTS
# (client, peer), TXHUB_HA_REDIS_PORTS (master, replica), TXHUB_HA_SENTINEL_PORTS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${TXHUB_HA_DIR:-$ROOT/var/ha}"
read -r -a PG_PORTS <<<"${TXHUB_HA_PG_PORTS:-54331 54332 54333}"
read -r -a REST_PORTS <<<"${TXHUB_HA_REST_PORTS:-8008 8009 8010}"
read -r ETCD_PORT ETCD_PEER_PORT <<<"${TXHUB_HA_ETCD_PORTS:-23790 23800}"
read -r -a REDIS_PORTS <<<"${TXHUB_HA_REDIS_PORTS:-63811 63812}"
read -r -a SENTINEL_PORTS <<<"${TXHUB_HA_SENTINEL_PORTS:-26381 26382 26383}"
# Patroni's timing (scripts/ha/patroni.yml.in): a SIGKILLed primary is replaced in ~ttl seconds;
# 20 is the least Patroni accepts.
TTL="${TXHUB_HA_TTL:-20}" LOOP_WAIT="${TXHUB_HA_LOOP_WAIT:-1}" RETRY_TIMEOUT="${TXHUB_HA_RETRY_TIMEOUT:-5}"
PG_USER_OS="${TXHUB_PG_OS_USER:-txhub-pg}"   # Postgres (so Patroni) refuses to run as root
PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
VENV="$ROOT/.venv"
REQUIREMENTS="$ROOT/scripts/ha/requirements.txt"

log() { printf '[ha] %s\n' "$*" >&2; }

# setpriv execs (runuser would stay as a parent, and stop for good with a SIGSTOPped Patroni).
AS_PG=(); [ "$(id -u)" = 0 ] && AS_PG=(setpriv --reuid="$PG_USER_OS" --regid="$PG_USER_OS" --init-groups --)
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_debian_packages() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
  [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null \
    || missing+=(python3-venv)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    # No service of the packages' own is wanted: ours run on our ports, from var/ha.
    for unit in etcd redis-sentinel; do
      as_root systemctl disable --now "$unit" >/dev/null 2>&1 \
        || as_root service "$unit" stop >/dev/null 2>&1 || true
    done
  fi
}

# Patroni runs as the unprivileged Postgres user, so from a venv of Debian's python3 in /var/tmp
# (readable by it), one per pinned requirements file, shared by every checkout.
patroni_venv() {
  local venv="/var/tmp/txhub-patroni-$(sha256sum "$REQUIREMENTS" | cut -c1-12)"
  if [ ! -f "$venv/.complete" ]; then
    log "installing Patroni into $venv"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q -r "$REQUIREMENTS" >&2
    chmod -R a+rX "$venv"
    touch "$venv/.complete"
  fi
  echo "$venv"
}

etcd_up() {
  if etcdctl --endpoints "127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1; then return 0; fi
  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  mkdir -p "$DIR/etcd"
  setsid etcd --name txhub --data-dir "$DIR/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "txhub=http://127.0.0.1:$ETCD_PEER_PORT" \
    >>"$DIR/etcd/etcd.log" 2>&1 </dev/null &
  echo $! >"$DIR/etcd/pid"
  for _ in $(seq 100); do
    etcdctl --endpoints "127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "etcd did not start; see $DIR/etcd/etcd.log"; return 1
}

node_up() {
  local n="$1" venv="$2"
  local node_dir="$DIR/node$n"
  local pid_file="$node_dir/patroni.pid"
  if [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then return 0; fi
  mkdir -p "$node_dir"
  [ "$(id -u)" = 0 ] && chown "$PG_USER_OS" "$node_dir"
  chmod 700 "$node_dir"
  NODE="node$n" NODE_DIR="$node_dir" DATA="$node_dir/data" PG_BIN="$PG_BIN" \
    PG_PORT="${PG_PORTS[$((n - 1))]}" REST_PORT="${REST_PORTS[$((n - 1))]}" \
    ETCD_PORT="$ETCD_PORT" LOG_LEVEL="${TXHUB_HA_LOG_LEVEL:-WARNING}" TTL="$TTL" LOOP_WAIT="$LOOP_WAIT" RETRY_TIMEOUT="$RETRY_TIMEOUT" \
    "$venv/bin/python" -c 'import os, string, sys; print(string.Template(sys.stdin.read()).substitute(os.environ))' \
    <"$ROOT/scripts/ha/patroni.yml.in" >"$node_dir/patroni.yml"
  [ "$(id -u)" = 0 ] && chown "$PG_USER_OS" "$node_dir/patroni.yml"
  log "starting Patroni node$n (Postgres 127.0.0.1:${PG_PORTS[$((n - 1))]}, REST :${REST_PORTS[$((n - 1))]})"
  # The shell writes Patroni's own pid (exec), so a chaos case can SIGKILL exactly it.
  setsid "${AS_PG[@]}" env HOME="$node_dir" /bin/sh -c 'echo $$ >"$1"; exec "$2" "$3"' sh \
    "$pid_file" "$venv/bin/patroni" "$node_dir/patroni.yml" \
    >>"$node_dir/patroni.log" 2>&1 </dev/null &
}

# The libpq multi-host string every txhub process uses: the first node that accepts writes.
database_url() {
  local hosts=()
  for port in "${PG_PORTS[@]}"; do hosts+=("127.0.0.1:$port"); done
  local joined; joined="$(IFS=,; echo "${hosts[*]}")"
  echo "postgres://txhub@$joined/${1:-txhub}?target_session_attrs=read-write&connect_timeout=2"
}

postgres_up() {
  local venv; venv="$(patroni_venv)"
  etcd_up
  for n in 1 2 3; do node_up "$n" "$venv"; done
  log "waiting for a primary and a synchronous standby"
  for _ in $(seq 600); do
    if "$PG_BIN/psql" "$(database_url postgres)" -tAc \
      "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'" 2>/dev/null \
      | grep -q '^[1-9]'; then
      break
    fi
    sleep 0.2
  done
  "$PG_BIN/psql" "$(database_url postgres)" -tAc \
    "SELECT 1 FROM pg_database WHERE datname='txhub'" | grep -q 1 \
    || "$PG_BIN/psql" "$(database_url postgres)" -qc "CREATE DATABASE txhub"
}

redis_up() {
  local master="${REDIS_PORTS[0]}" replica="${REDIS_PORTS[1]}"
  for port in "$master" "$replica"; do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && continue
    mkdir -p "$DIR/redis-$port"
    local follow=()
    # Only on the first start: afterwards the Sentinels decide who follows whom (they rewrite
    # the config file the server was started with).
    [ "$port" = "$replica" ] && [ ! -f "$DIR/redis-$port/redis.conf" ] \
      && follow=(--replicaof 127.0.0.1 "$master")
    touch "$DIR/redis-$port/redis.conf"
    log "starting Redis on 127.0.0.1:$port"
    redis-server "$DIR/redis-$port/redis.conf" --bind 127.0.0.1 --port "$port" --daemonize yes \
      --dir "$DIR/redis-$port" --pidfile "$DIR/redis-$port/redis.pid" \
      --logfile "$DIR/redis-$port/redis.log" --appendonly yes --save "" "${follow[@]}"
  done
  for port in "${SENTINEL_PORTS[@]}"; do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && continue
    mkdir -p "$DIR/sentinel-$port"
    local conf="$DIR/sentinel-$port/sentinel.conf"
    if [ ! -f "$conf" ]; then
      # Two of three Sentinels agree that the master is down after 3 s; then one fails over.
      cat >"$conf" <<CONF
bind 127.0.0.1
port $port
sentinel monitor txhub 127.0.0.1 $master 2
sentinel down-after-milliseconds txhub 3000
sentinel failover-timeout txhub 10000
CONF
    fi
    log "starting Redis Sentinel on 127.0.0.1:$port"
    redis-sentinel "$conf" --daemonize yes --dir "$DIR/sentinel-$port" \
      --pidfile "$DIR/sentinel-$port/sentinel.pid" --logfile "$DIR/sentinel-$port/sentinel.log"
  done
  for _ in $(seq 100); do
    redis-cli -h 127.0.0.1 -p "${SENTINEL_PORTS[0]}" sentinel get-master-addr-by-name txhub \
      2>/dev/null | grep -q 127.0.0.1 && return 0
    sleep 0.1
  done
  log "Redis Sentinel did not start; see $DIR/sentinel-*/sentinel.log"; return 1
}

write_env() {
  local sentinels=()
  for port in "${SENTINEL_PORTS[@]}"; do sentinels+=("127.0.0.1:$port"); done
  # Read by txhub/settings.py when present, and sourced by `scripts/ha.sh run`: single-quoted,
  # as the URL's "&" would end a shell command.
  cat >"$DIR/env.tmp" <<ENV
DATABASE_URL='$(database_url)'
TXHUB_REDIS_SENTINELS='$(IFS=,; echo "${sentinels[*]}")'
TXHUB_REDIS_SENTINEL_MASTER='txhub'
ENV
  mv "$DIR/env.tmp" "$DIR/env"
}

stop_pid_file() {
  local file="$1" sig="${2:-TERM}"
  [ -f "$file" ] || return 0
  local pid; pid="$(cat "$file")"
  kill -"$sig" "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  rm -f "$file"
}

down() {
  [ -d "$DIR" ] || return 0
  rm -f "$DIR/env"
  for port in "${SENTINEL_PORTS[@]}" "${REDIS_PORTS[@]}"; do
    redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
  done
  # Patroni stops its Postgres on SIGTERM (a clean shutdown); all three at once, as all go down.
  for n in 1 2 3; do stop_pid_file "$DIR/node$n/patroni.pid" & done
  wait
  stop_pid_file "$DIR/etcd/pid"
  log "HA cluster stopped"
}

case "${1:-up}" in
  up)
    "$ROOT/scripts/services.sh" prepare
    ensure_debian_packages
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ] && ! runuser -u "$PG_USER_OS" -- test -x "$DIR"; then
      log "$DIR is not reachable by $PG_USER_OS (Postgres's user): set TXHUB_HA_DIR"; exit 1
    fi
    postgres_up
    redis_up
    write_env
    (cd "$ROOT" && set -a && . "$DIR/env" && set +a \
      && "$VENV/bin/python" manage.py migrate --noinput -v 0)
    ;;
  # `make run-ha`, after `up`: scripts/run.sh with the cluster's environment and two beats.
  run)
    set -a && . "$DIR/env" && set +a
    [ -n "${DATABASE_URL:-}" ] && [ -n "${TXHUB_REDIS_SENTINELS:-}" ] \
      || { log "$DIR/env does not name the cluster: run scripts/ha.sh up"; exit 1; }
    TXHUB_SERVICES="$ROOT/scripts/ha.sh" TXHUB_BEATS="${TXHUB_BEATS:-2}" exec "$ROOT/scripts/run.sh"
    ;;
  down) down ;;
  start-node) node_up "$2" "$(patroni_venv)" ;;
  start-etcd) etcd_up ;;
  start-redis) redis_up ;;
  patroni-venv) patroni_venv ;;
  database-url) database_url ;;
  *) echo "usage: $0 up|run|down|start-node N|start-etcd|start-redis|patroni-venv|database-url" >&2; exit 2 ;;
esac
