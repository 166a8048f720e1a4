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

.PHONY: setup model llama-server gui-deps fonts run test lint shot bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch first, pinned, so the project's range is already satisfied and no multi-GB CUDA build is pulled.
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

model: $(STAMP)
	$(VENV)/bin/playground fetch-model

# llama.cpp's server (remote models), built once per machine into the user cache from a pinned source; prints its path.
llama-server: $(STAMP)
	$(PY) -m playground.remote.llama_build

# Qt's X11 plugin needs a few system libraries pip cannot install (libxcb-cursor0 and friends): add them if missing.
gui-deps: $(STAMP)
	-$(PY) -m playground.ui.system_libs --install

# A font that covers Chinese (Debian's minimal images have none): installed once with apt-get if missing.
fonts: $(STAMP)
	-$(PY) -m playground.ui.fonts --install

run: model gui-deps fonts
	$(VENV)/bin/playground

test: model fonts llama-server
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check playground tests benchmarks

shot: model
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/playground shot --out resources/screenshots/greedy.png

bench: model
	$(PY) benchmarks/bench_greedy.py

clean:
	rm -rf $(VENV)
