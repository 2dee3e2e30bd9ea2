# The two commands of the README: `make demo` runs the product, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The agent's and the CLI's dependency wheels, for installing their wheels offline (a provider's server, a buyer's
# laptop; tests/nodeagent/test_wheel.py, tests/cli/test_cli_live.py).
WHEELHOUSE := $(VENV)/wheelhouse

.PHONY: demo test venv bench clean agent-wheel cli-wheel

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

# Apart from $(STAMP) so that a venv made before it gets the wheels on its next `make venv` or `make test`.
$(WHEELHOUSE)/.downloaded: $(STAMP)
	$(PY) -m pip download --quiet --dest $(WHEELHOUSE) $$( ( $(PY) -m nodeagent.packaging.build --pins; \
		$(PY) -m nodeagent.packaging.build --wheel cli --pins ) | sort -u)
	touch $@

venv: $(STAMP) $(WHEELHOUSE)/.downloaded

demo: $(STAMP)
	DJANGO_SETTINGS_MODULE=config.settings.dev $(PY) manage.py demo

test: $(STAMP) $(WHEELHOUSE)/.downloaded
	$(PY) -m tests.parallel

bench: $(STAMP)
	$(PY) bench/decision_speed.py --quick
	$(PY) bench/placement_quality.py --quick
	$(PY) bench/metrics_ingest.py --quick

# The agent's own wheel (standard library only): dist/gpumarket_agent-<version>-py3-none-any.whl
agent-wheel:
	$(PYTHON) -m nodeagent.packaging.build --out dist

# The command line's own wheel (`gpum`; standard library and websockets): dist/gpumarket_cli-<version>-py3-none-any.whl
cli-wheel:
	$(PYTHON) -m nodeagent.packaging.build --wheel cli --out dist

clean:
	rm -rf var staticfiles .pytest_cache
