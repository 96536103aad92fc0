# llmgw-web: `make run` starts the demo, `make test` runs the whole suite.
# Only Python 3.11+ is needed beforehand: uv is brought in a local venv when absent.

UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
PY := .venv/bin/python
export DJANGO_SETTINGS_MODULE := llmgw_web.settings

.PHONY: run test test-agent lint install demo-db browser-deps screenshots bench bench-dry-run serve scale-out

.tools/bin/uv:
	python3 -m venv .tools
	.tools/bin/pip install --quiet uv

.venv/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen
	touch $@

install: .venv/.synced

# The demo's GGUF model is written under the demo directory, a path source: the launch policy takes
# a path only under LLMGW_MODEL_ROOTS, so the demo's runs name it (unless the environment does).
demo-db run: export LLMGW_MODEL_ROOTS := $(or $(LLMGW_MODEL_ROOTS),$(or $(LLMGW_DEMO_DIR),/tmp/llmgw-demo))
# The demo's agents listen on 127.0.0.1, which an agent URL may name only when LLMGW_AGENT_NETWORKS
# names loopback (by default: the private ranges alone): the demo's runs name it (unless the
# environment sets the networks).
DEMO_AGENT_NETWORKS := private,127.0.0.0/8
demo-db run: export LLMGW_AGENT_NETWORKS := $(or $(LLMGW_AGENT_NETWORKS),$(DEMO_AGENT_NETWORKS))

demo-db: install
	mkdir -p var
	DJANGO_DEBUG=1 $(PY) manage.py migrate --no-input
	DJANGO_DEBUG=1 $(PY) manage.py seed_demo --users --as demo

# A node agent per demo node (stand-in engines), the seeded replicas started on them, the worker and
# the web server on http://127.0.0.1:8000; Ctrl-C stops them all (demo/management/commands/demo.py).
run: demo-db
	DJANGO_DEBUG=1 $(PY) manage.py demo --as demo --addr 127.0.0.1:8000

# The browser tests drive Debian's Chromium through Playwright (its Python package comes from uv sync and
# never downloads a browser of its own): installed with apt-get only when it is missing.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser-deps:
	@test -x $(CHROMIUM) || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }

# The control plane's tests (pytest, in XDIST's worker processes: most tests wait on agents, engines
# and the database, so four keep two cores busy; XDIST= runs them in one), then the node agent's
# with the standard library alone (-I -S: no site packages, no environment), as the agent runs on a node.
XDIST ?= -n 4 --dist worksteal
test: install browser-deps
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-agent

test-agent: install
	cd agent && ../$(PY) -I -S -m unittest

# The README's screenshots, taken by the browser tests at a laptop's width (1366 px).
screenshots: install browser-deps
	SCREENSHOTS_DIR=docs/screenshots $(PY) -m pytest -q -m browser tests/browser/

# What the style guide promises, checked: ruff (lint and format), types (mypy with the Django and DRF
# stubs), no import cycle, no import against docs/design.md's layers, no model change without its migration, and an OpenAPI schema without a warning.
lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	DJANGO_DEBUG=1 .venv/bin/mypy
	$(PY) tools/import_cycles.py
	$(PY) tools/layers.py
	DJANGO_DEBUG=1 DATABASE_URL=sqlite://:memory: $(PY) manage.py makemigrations --check --dry-run
	DJANGO_DEBUG=1 DATABASE_URL=sqlite://:memory: $(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null

# The app as in production: static files collected (whitenoise serves them, compressed), gunicorn
# with WEB_WORKERS processes on ADDR. Needs the production settings in the environment
# (DJANGO_SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL; README, "Settings") and a migrated database.
WEB_WORKERS ?= 2
ADDR ?= 127.0.0.1:8000
serve: install
	$(PY) manage.py collectstatic --no-input --verbosity 0
	exec .venv/bin/gunicorn llmgw_web.wsgi --workers $(WEB_WORKERS) --bind $(ADDR) \
		--access-logfile - --graceful-timeout 10 --keep-alive 5

# The benchmark (docs/benchmarks.md): the generated 1,000-node fleet on PostgreSQL, served by
# make serve, every page against the floor, each asked by the role it needs, warm, right after a
# write and under the sampler's writes, the load average beside each; the restart fan-out against its
# ideal on a loaded machine (two processes kept busy meanwhile: BENCH_FANOUT_ARGS); two web processes
# and two workers sharing a fan-out, one worker killed; a telemetry round at 1,000 nodes against its
# interval; and the audit log's verifier at a million entries. Each on a database of its own
# (BENCH_DATABASE_URL, BENCH_FANOUT_DATABASE_URL, BENCH_SCALE_DATABASE_URL,
# BENCH_TELEMETRY_DATABASE_URL, BENCH_VERIFY_DATABASE_URL). Every part runs even when one before it
# missed its target or failed; the exit status is then 1.
# BENCH_PAGES_ARGS for the pages', e.g. "--nodes 200 --audit 100000" on a machine too busy for 1,000.
BENCH_PAGES_ARGS ?=
BENCH_FANOUT_ARGS ?= --busy 2
bench: install
	@failed=""; \
	$(PY) bench/pages.py $(BENCH_PAGES_ARGS) || failed="$$failed pages"; \
	$(PY) bench/fanout.py $(BENCH_FANOUT_ARGS) || failed="$$failed fanout"; \
	$(PY) bench/scale_out.py || failed="$$failed scale_out"; \
	$(PY) bench/telemetry_round.py || failed="$$failed telemetry_round"; \
	$(PY) bench/audit_verify.py || failed="$$failed audit_verify"; \
	if [ -n "$$failed" ]; then echo "make bench: missed a target or failed:$$failed" >&2; exit 1; fi

scale-out: install
	$(PY) bench/scale_out.py

# How long the live form's dry run takes at 10 to 5000 nodes, in-process (docs/benchmarks.md).
bench-dry-run: install
	$(PY) bench/resize_dry_run.py
