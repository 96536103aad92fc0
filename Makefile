# llmgw-web: `make run` starts the demo, `make test` runs the whole suite.
# Only Python 3.11+ is needed beforehand: uv is brought in a local venv when absent.

UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
PY := .venv/bin/python
export DJANGO_SETTINGS_MODULE := llmgw_web.settings

.PHONY: run test lint install demo-db

.tools/bin/uv:
	python3 -m venv .tools
	.tools/bin/pip install --quiet uv

.venv/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen
	touch $@

install: .venv/.synced

demo-db: install
	mkdir -p var
	DJANGO_DEBUG=1 $(PY) manage.py migrate --no-input
	DJANGO_DEBUG=1 $(PY) manage.py seed_demo --users --as demo

run: demo-db
	DJANGO_DEBUG=1 $(PY) manage.py runserver 127.0.0.1:8000

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	.venv/bin/ruff check .
