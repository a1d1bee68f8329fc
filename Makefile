# txhub: `make run` starts everything, `make test` proves it. Both set up what is missing first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run run-ha test lint bench chaos setup down clean schema

setup:
	scripts/services.sh up

run: setup
	scripts/run.sh

# The same processes on a three-node Postgres cluster (Patroni + etcd) and Redis with a replica and
# three Sentinels, under var/ha (scripts/ha.sh; docs/operations.md "High availability"). Two beats.
run-ha:
	scripts/ha.sh up
	scripts/ha.sh run

test:
	scripts/test.sh $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# Against a running `make run` (same checkout); BENCH_ARGS="--runs 3" for medians of 3 runs.
bench:
	$(PY) bench/produce_consume.py $(BENCH_ARGS)

# Every fault case of the history checker, full length, on a Postgres/Redis/web/Celery of its own.
chaos: setup
	$(PY) -m tests.chaos.run $(CASES)

down:
	scripts/services.sh down
	scripts/ha.sh down

clean: down
	rm -rf var

schema: setup
	$(PY) manage.py spectacular --file docs/openapi.yaml
