# Every target creates .venv when it is missing, so each works alone on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch is pinned before the project: 2.13.0 is the local CPU wheel; a range would pull a CUDA build.
TORCH := torch==2.13.0

.PHONY: install lock demo test test-fast lint fixtures bench bench-scale fuzz clean tie-table torch-allowlist onnx-descriptor sweep rules-doc

# constraints.txt pins the test environment (the libraries the committed generated data was made
# from, and everything else), so a release on the index cannot change what CI runs.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -c constraints.txt -e '.[torch,runtime,transformers,dev]'
	touch $(STAMP)

install: $(STAMP)

# Rewrite constraints.txt from the installed environment: after upgrading a library on purpose
# (pip install -U transformers, then make tie-table), run this and commit both.
lock: $(STAMP)
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^#' | sed 's/+cpu$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

fixtures: $(STAMP)
	$(PY) fixtures/generate.py fixtures/generated

# The model-class tie table (tieaudit/formats/tie_table.json) from the installed transformers:
# run after changing the pinned transformers version, then commit the table.
tie-table: $(STAMP)
	$(PY) scripts/gen_tie_table.py --jobs 2

# torch's weights_only allowlist (tieaudit/formats/torch_allowlist.json) from the installed torch:
# run after changing the pinned torch version, then commit the data (tests/test_torch_allowlist.py).
torch-allowlist: $(STAMP)
	$(PY) scripts/gen_torch_allowlist.py

# onnx's protobuf schema (tieaudit/formats/onnx_descriptor.py), which the ONNX reader parses with
# without importing onnx: run after changing the pinned onnx version (tests/test_onnx_proto.py).
onnx-descriptor: $(STAMP)
	$(PY) scripts/gen_onnx_descriptor.py
	$(VENV)/bin/ruff format tieaudit/formats/onnx_descriptor.py

# docs/rules.md from the rules' texts (tieaudit/rules/texts.py): run after changing a rule's text, then
# commit both (tests/test_rule_docs.py fails while the page is stale).
rules-doc: $(STAMP)
	$(PY) scripts/gen_rules_doc.py

# The architecture sweep (tests/sweep): every class of the tie table that transformers builds tiny
# on CPU, each variant written, audited, retied and reloaded; tests/sweep/LAST_RUN.md and .json.
# `make test` runs the fast subset (tests/test_sweep.py). SWEEP_ARGS adds options, for instance
# SWEEP_ARGS='--deadline 3000' (start no class after 50 min) or '--classes GPT2LMHeadModel'.
SWEEP_JOBS ?= 2
SWEEP_TIMEOUT ?= 300
SWEEP_ARGS ?=
sweep: $(STAMP)
	nice -n 10 $(PY) -m tests.sweep.run --jobs $(SWEEP_JOBS) --timeout $(SWEEP_TIMEOUT) \
		--out tests/sweep/LAST_RUN.json --markdown tests/sweep/LAST_RUN.md $(SWEEP_ARGS)

demo: $(STAMP)
	$(PY) scripts/demo.py demo

# The whole suite in TEST_WORKERS xdist workers, a module per worker at a time (--dist loadfile: a
# module's fixtures are built once), in the order tests/conftest.py collects them: the slowest
# modules first (--no-loadscope-reorder: xdist would otherwise order modules by test count).
# test-fast leaves out the modules marked slow (SLOW_MODULES in tests/conftest.py): a quick
# check while working, never instead of `make test`.
TEST_WORKERS ?= 2
test: $(STAMP) fixtures
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP) fixtures
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check tieaudit tests fixtures bench scripts fuzz
	$(VENV)/bin/mypy --strict tieaudit
	$(VENV)/bin/mypy --config-file tests/mypy.ini tests/*.py

bench: $(STAMP)
	$(PY) bench/detect.py
	$(PY) bench/retie.py
	$(PY) bench/many.py
	$(PY) bench/runtime.py
	$(PY) bench/convert.py
	$(PY) bench/startup.py

# Checkpoints at the sizes users run (bench/scale.py): ~32 GB of generated inputs and outputs under
# bench/out/scale/, about 15 minutes; drops the page cache for its cold runs where it may (root).
bench-scale: $(STAMP)
	$(PY) bench/scale.py

# Long fuzzing run (fuzz/run.py): atheris when it installs for this Python, else hypothesis. Then the
# pickle verdict differential (fuzz/pickle_verdict.py): PICKLE_VERDICT_CASES mutants of the corpus
# pickles against torch.load(weights_only=True), seeded from the clock unless PICKLE_VERDICT_SEED is
# set (make test runs a fixed-seed subset); mismatches go to fuzz/out/pickle_verdict/failures.
FUZZ_SECONDS ?= 60
FUZZ_WORKERS ?= 2
PICKLE_VERDICT_CASES ?= 30000
PICKLE_VERDICT_SEED ?=
fuzz: $(STAMP) fixtures
	$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q atheris || echo "atheris unavailable: the hypothesis engine runs"
	status=0; \
	$(PY) fuzz/run.py --seconds $(FUZZ_SECONDS) --workers $(FUZZ_WORKERS) || status=1; \
	$(PY) fuzz/pickle_verdict.py --cases $(PICKLE_VERDICT_CASES) --workers $(FUZZ_WORKERS) \
		$(if $(PICKLE_VERDICT_SEED),--seed $(PICKLE_VERDICT_SEED)) || status=1; \
	exit $$status

clean:
	rm -rf demo fixtures/generated bench/out .pytest_cache .mypy_cache .ruff_cache
