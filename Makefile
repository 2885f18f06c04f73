# Gatehouse. `make run` starts the embedded mode; `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# The suite runs against the real Postgres and Redis.
export TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/gatehouse

.PHONY: run test lint bench-checkpoints bench-resume bench-audit

$(VENV)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# The embedded mode: migrate, demo users and key, web server, worker and beat.
# Another address: make run ARGS="--bind 127.0.0.1:8001".
run: $(VENV)/.runtime
	$(PY) manage.py run_embedded $(ARGS)

test: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest

# Ruff, and the import contracts of pyproject.toml (the allowed directions
# between apps, no cycles inside one): CI runs it before the suite.
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

bench-checkpoints: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) bench/checkpoints.py

bench-resume: $(VENV)/.dev
	$(PY) bench/resume.py

.PHONY: bench-retention

# The TTL expiry sweep over 1M expired checkpoints, beside live writes (own
# database); `--scale 0.1` for a quick run: make bench-retention ARGS="--scale 0.1".
bench-retention: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) bench/retention.py $(ARGS)

.PHONY: bench-admin screenshots

# The reviewer queue and dashboard with 100,000 pending requests (own database).
bench-admin: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) bench/admin_queue.py

# Regenerate docs/screenshots/ from the browser tests (needs /usr/bin/chromium).
screenshots: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) GATEHOUSE_SCREENSHOT_DIR=docs/screenshots \
		$(PY) -m pytest tests/e2e -q

bench-audit: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) bench/audit.py

.PHONY: bench-peers

# Gatehouse beside DBOS Transact and plain LangGraph on the refund case (own
# databases; Redis db 13, flushed: ARGS=--redis-url=...); about 40 minutes on
# a busy machine, or a short run: make bench-peers ARGS=--quick.
bench-peers: $(VENV)/.dev
	DATABASE_URL=$(TEST_DATABASE_URL) $(PY) bench/peers.py $(ARGS)

.PHONY: bench-stream

# The Agent Protocol over the SDK: resume -> finished through runs.wait, join and
# stream, first-event latency, flows/s at concurrency 20 (own database; Redis db 12, flushed: ARGS=--redis-db=N).
bench-stream: $(VENV)/.dev
	$(PY) bench/stream.py $(ARGS)
