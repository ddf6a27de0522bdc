PY ?= python3

.PHONY: setup demo test lint proto bench

setup:
	$(PY) -m pip install -q -e '.[dev]'

demo: setup
	$(PY) -m cli.main demo

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

proto:
	$(PY) -m kvstore.v1.regen

bench:
	$(PY) bench/tiers.py
