# The two commands of the README: `make demo` runs the product, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	DJANGO_SETTINGS_MODULE=config.settings.dev $(PY) manage.py demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/decision_speed.py --quick
	$(PY) bench/placement_quality.py --quick
	$(PY) bench/metrics_ingest.py --quick

clean:
	rm -rf var staticfiles .pytest_cache
