# Every target creates .venv when it is missing, so each works alone on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch is pinned before the project: 2.13.0 is the local CPU wheel; a range would pull a CUDA build.
TORCH := torch==2.13.0

.PHONY: install demo test lint fixtures bench fuzz clean tie-table

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[torch,runtime,transformers,dev]'
	touch $(STAMP)

install: $(STAMP)

fixtures: $(STAMP)
	$(PY) fixtures/generate.py fixtures/generated

# The model-class tie table (tieaudit/formats/tie_table.json) from the installed transformers:
# run after changing the pinned transformers version, then commit the table.
tie-table: $(STAMP)
	$(PY) scripts/gen_tie_table.py --jobs 2

demo: $(STAMP)
	$(PY) scripts/demo.py demo

test: $(STAMP) fixtures
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check tieaudit tests fixtures bench scripts fuzz
	$(VENV)/bin/mypy --strict tieaudit

bench: $(STAMP)
	$(PY) bench/detect.py
	$(PY) bench/retie.py
	$(PY) bench/many.py
	$(PY) bench/runtime.py

# Long fuzzing run (fuzz/run.py): atheris when it installs for this Python, else hypothesis.
FUZZ_SECONDS ?= 60
FUZZ_WORKERS ?= 2
fuzz: $(STAMP) fixtures
	$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q atheris || echo "atheris unavailable: the hypothesis engine runs"
	$(PY) fuzz/run.py --seconds $(FUZZ_SECONDS) --workers $(FUZZ_WORKERS)

clean:
	rm -rf demo fixtures/generated bench/out .pytest_cache .mypy_cache .ruff_cache
