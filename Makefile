# Two commands on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
APT    := $(shell command -v apt-get 2>/dev/null)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
# llama.cpp (inside llama-cpp-python) builds for "-march=native" by default, AMX included where
# the CPU has it; on this project's 2-core VM (Sapphire Rapids, AMX listed by CPU and kernel)
# its AMX kernels died of SIGILL (tileloadd) on the first prompt, so every local model call
# failed. On x86_64 it is built instead for the features /proc/cpuinfo lists, AMX left out (it
# speeds up large batches, not a small model's prompts); a CMAKE_ARGS of your own wins.
X86_FEATURES := SSE42:sse4_2 AVX:avx AVX2:avx2 BMI2:bmi2 FMA:fma F16C:f16c AVX_VNNI:avx_vnni \
  AVX512:avx512f AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16
ifeq ($(shell uname -m),x86_64)
CMAKE_ARGS ?= $(shell flags=" $$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "; \
  [ "$$flags" = "  " ] && exit 0; \
  printf %s "-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"; \
  for pair in $(X86_FEATURES); do case "$$flags" in (*" $${pair#*:} "*) on=ON;; (*) on=OFF;; esac; \
  printf ' %s' "-DGGML_$${pair%%:*}=$$on"; done)
export CMAKE_ARGS
endif
# pip keeps a wheel it built in its cache and hands it back whatever CMAKE_ARGS say now: a CI
# run on main got the cached -march=native (AMX) build this way and every embedded-model test
# died of SIGILL. So llama-cpp-python is built without that cache, once per CMAKE_ARGS, into a
# folder named after them, and installed from there.
LLAMA_SPEC   := llama-cpp-python[server]>=0.3
LLAMA_WHEELS ?= $(HOME)/.cache/flowmagic/llama-wheels/$(shell printf %s "$(CMAKE_ARGS)" | sha256sum | cut -c1-16)

.PHONY: setup system-deps browser-deps test test-fast demo demo-text bench bench-analysis clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip wheel
	@echo "installing flowmagic with its extras (llama-cpp-python compiles from source: ~6 min on 2 cores)"
	@mkdir -p $(LLAMA_WHEELS)
	@ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
	  $(PIP) wheel --quiet --no-cache-dir --no-deps --wheel-dir $(LLAMA_WHEELS) '$(LLAMA_SPEC)'
	$(PIP) install --quiet $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(PIP) install --quiet -e '.[local,test,data,dask]'
	touch $(STAMP)

setup: $(STAMP) system-deps

# graphviz's `dot` draws the plans, bubblewrap isolates model-written code: Debian's packages when missing.
system-deps:
	@if ! command -v dot >/dev/null; then \
	  if [ -n "$(APT)" ]; then $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq graphviz; \
	  else echo "graphviz is missing: install it (apt-get install graphviz / brew install graphviz / conda install graphviz)"; fi; \
	fi
	@# bubblewrap isolates model-written code; without it flowmagic runs no such code.
	@if ! command -v bwrap >/dev/null; then \
	  if [ -n "$(APT)" ]; then $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; \
	  else echo "bubblewrap is missing: install it (apt-get install bubblewrap / dnf install bubblewrap); until then flowmagic runs no model-written code"; fi; \
	fi
	@# As root the sandbox tests run once more as an unprivileged user, who cannot run an interpreter
	@# under a 0700 /root (pyenv's, on Debian): they make that user a venv from the system's python3.
	@if [ "$$(id -u)" = 0 ] && [ ! -x /usr/bin/python3 ] && [ ! -x /usr/local/bin/python3 ]; then \
	  if [ -n "$(APT)" ]; then apt-get update -qq && apt-get install -y -qq python3 python3-venv; \
	  else echo "no system python3: the sandbox tests as an unprivileged user need one outside /root"; fi; \
	fi

# Debian's chromium for the browser test (Playwright drives /usr/bin/chromium; it never downloads a browser).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ -n "$(APT)" ]; then $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; \
	  else echo "chromium is missing at /usr/bin/chromium: install it to run the browser test"; fi; \
	fi

# lint-imports checks the layer contracts in pyproject.toml ([tool.importlinter]) first.
test: setup browser-deps
	$(VENV)/bin/lint-imports --no-logo
	$(PY) -m pytest

test-fast: setup
	$(VENV)/bin/lint-imports --no-logo
	$(PY) -m pytest -m "not embedded and not browser"

# The data-science job on the shipped CSV (Anscombe's quartet): the embedded model plans it, its
# code runs in the sandbox's Python session on the table, the printed numbers and the figure land in
# out/, and the exported notebook is replayed. Small caps keep it under 2 minutes on 2 cores; one
# subtask, so the node that runs flowmagic's working start is the whole plan and a weak answer
# leaves that start's real output, said as such, instead of a failed second subtask.
DEMO_TASK ?= Explore the data in anscombe.csv with pandas and matplotlib: print the mean of x and y and the correlation of x and y per dataset, draw a scatter plot of y against x, and write three findings that quote the printed numbers
DEMO_SEED ?= 0
demo: setup
	$(VENV)/bin/flowmagic run "$(DEMO_TASK)" --inputs flowmagic/templates/data/anscombe.csv --name anscombe --k 1 --max-tokens 200 --set continuations=1 --set max_attempts=2 --set max_subtasks=1 --set update=off --set seed=$(DEMO_SEED) --out out

# A text-only flow: no data, no code.
demo-text: setup
	$(VENV)/bin/flowmagic run "Write a short guide to brewing green tea: pick the leaves, heat the water, steep, and serve" --k 2 --max-tokens 200 --out out

# Every figure of bench/RESULTS.md's summary in one run (25-35 minutes on a quiet 2-core
# machine: whole flows on the embedded model are part of it); BENCH_ARGS="--quick" checks the harness.
BENCH_ARGS ?=
bench: setup
	$(PIP) install --quiet -e '.[bench]'
	$(PY) bench/run.py $(BENCH_ARGS)

# Right answers on dabench-dev (issue 29): flowmagic against the one-call baseline on the bench
# model, which is downloaded and checked on first use (bench/benchmodel.py); never in `make test`.
ANALYSIS_ARGS ?= --limit 24 --seed 0 --resume
bench-analysis: setup
	$(PY) bench/analysis.py $(ANALYSIS_ARGS)

clean:
	rm -rf $(VENV) out build *.egg-info .pytest_cache
