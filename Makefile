# The two commands a reader needs: `make book` (build and serve the book) and `make test`.
# Everything else here is what those two are made of.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SERVE  ?= 1
PORT   ?= 8000
VENDOR := _build/vendor
LITE_WHEELS := _build/lite-wheels/.installed
STRICT := --all -W -n --keep-going

.PHONY: book test check lab install vendor notebooks lint clean wasm constraints notebook-times

# --- set-up -------------------------------------------------------------------------------
# Exact versions from constraints.txt (what CI tests); `make book CONSTRAINTS=` installs from
# pyproject.toml's ranges instead, e.g. on a Python the pins have no wheels for.
CONSTRAINTS ?= constraints.txt
# On Linux, PyPI's PyTorch wheel bundles CUDA (gigabytes a CPU machine never uses): take the CPU
# build from PyTorch's own index, as Binder and CI do. `make install TORCH_INDEX=` keeps PyPI's.
# Only torch is looked up there (--no-deps), so a machine that cannot reach that index pays one
# failed lookup, not one per package; the rest comes from PyPI as usual.
ifeq ($(shell uname -s),Linux)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
PIP_INSTALL = $(BIN)/python -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
TORCH_CPU = $(if $(TORCH_INDEX),$(PIP_INSTALL) --no-deps --extra-index-url $(TORCH_INDEX) torch)

# Everything: the reader's install and the book, test and WASM toolchains.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(TORCH_CPU)
	$(PIP_INSTALL) -e '.[torch,book,test,lab]'
	touch $@ $(VENV)/.reader

# A reader's install: what the ten notebooks import, and JupyterLab.
$(VENV)/.reader: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(TORCH_CPU)
	$(PIP_INSTALL) -e '.[torch,lab]'
	touch $@

install: $(VENV)/.installed

# After changing pyproject.toml's dependencies: install from the ranges, test, then pin what passed.
constraints: install
	{ echo "# Exact versions for reproducible installs: \`make install\` and CI install with \`-c constraints.txt\`;"; \
	  echo "# pyproject.toml keeps ranges. Regenerate with \`make constraints\` after changing the environment."; \
	  $(BIN)/python -m pip freeze --all --exclude-editable | grep -v '^posttrainllm' | sed -E 's/\+[A-Za-z0-9.]+$$//' \
	  | sort -f; } > constraints.txt

# The book serves its own copies of require.js, the ipywidgets HTML manager and MathJax
# (exact versions in package-lock.json), so no page loads anything from another host.
$(VENDOR)/.installed: package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/html-manager
	cp node_modules/requirejs/require.js $(VENDOR)/require.min.js
	cp -r node_modules/mathjax/es5 $(VENDOR)/mathjax
	find node_modules/@jupyter-widgets/html-manager/dist -maxdepth 1 -type f ! -name '*.map' \
	  -exec cp {} $(VENDOR)/html-manager/ \;
	touch $@

# The browser editions' pure-Python wheels (IPython, micropip, ipywidgets, ...), served by the
# book's JupyterLite site so its Pyodide kernel starts with no network (book/_ext/lite_site.py).
$(LITE_WHEELS): $(VENV)/.installed $(VENDOR)/.installed book/_ext/lite_site.py
	$(BIN)/python book/_ext/lite_site.py wheels
	touch $@

vendor: $(VENDOR)/.installed $(LITE_WHEELS)

# --- the two commands ----------------------------------------------------------------------
# The reference chapters execute during the build and load the shared models: the book's extension
# trains any the cache lacks before the first chapter runs (posttrainllm models), a bar for each.
book: install vendor
	$(BIN)/jupyter-book build $(STRICT) .
ifeq ($(SERVE),1)
	$(BIN)/python -m posttrainllm.tools.serve _build/html --port $(PORT)
else
	@echo "Built the book into _build/html (serve it with: make book)"
endif

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg
# each pytest run lists its slowest tests, so a run's log says where its time went
DURATIONS := --durations=15

# A second CPU code path that every x86-64 CPU has: PyTorch's unvectorised kernels, MKL's and
# oneDNN's SSE code, OpenBLAS's Nehalem kernels, numpy's baseline loops and one BLAS thread.
# Outputs stored on an AVX2 or AVX-512 machine must come out the same under it (README:
# "Same outputs on every machine"); off x86-64 only PyTorch's and OpenBLAS's knobs apply.
ifeq ($(shell uname -m),x86_64)
SECOND_PATH := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41 \
  OPENBLAS_CORETYPE=Nehalem NPY_DISABLE_CPU_FEATURES=X86_V3 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
else
SECOND_PATH := ATEN_CPU_CAPABILITY=default OPENBLAS_NUM_THREADS=1
endif
SECOND_CACHE := _build/second-path-cache
# each notebook's time under nbval, kept for the book's timing page, which a later pytest run builds
NBVAL_TIMES := _build/reports/nbval-times.json
SECOND_PATH_NOTEBOOKS := $(wildcard notebooks/[0-9][0-9]-*.ipynb)

# the stored outputs are CPU outputs: a reader's POSTTRAINLLM_DEVICE=auto must not move the tests to a GPU
test: export POSTTRAINLLM_DEVICE :=
test: install vendor
	$(BIN)/ruff check .
	# the shared models first, so the notebooks' timings are a reader's second run, not the one-off training
	$(BIN)/posttrainllm models
	# unit tests two at a time: most of them run on one core; those that run a whole notebook go alone
	# (a notebook's kernel pins PyTorch to two threads, and two such side by side slow each other many times over)
	$(BIN)/python -m pytest tests/unit tests/wasm -n 2 -m "not serial" $(DURATIONS)
	$(BIN)/python -m pytest tests/unit -m serial $(DURATIONS)
	# the notebooks one at a time: each pins PyTorch to two threads (the same sums on every machine), so two
	# side by side would fight over two cores, and their times are what a reader's two cores give
	rm -f $(NBVAL_TIMES)
	POSTTRAINLLM_NBVAL_TIMES=$(abspath $(NBVAL_TIMES)) $(BIN)/python -m pytest notebooks $(NBVAL) $(DURATIONS)
	# the notebooks again on the second code path, their models trained afresh in a cache of their own
	rm -rf $(SECOND_CACHE)
	$(SECOND_PATH) POSTTRAINLLM_CACHE=$(abspath $(SECOND_CACHE)) $(BIN)/python -m pytest $(SECOND_PATH_NOTEBOOKS) \
	  $(NBVAL) -p no:cacheprovider $(DURATIONS)
	# the book, as a first `make book` builds it: from a cache that holds no model of an earlier run (the
	# one this run's second path trained), so the build trains the reference shelf's models itself
	POSTTRAINLLM_CACHE=$(abspath $(SECOND_CACHE)) POSTTRAINLLM_NBVAL_TIMES=$(abspath $(NBVAL_TIMES)) \
	  $(BIN)/python -m pytest tests/book $(DURATIONS)
	# the WGSL kernels on both CPU Vulkan drivers: a process picks its driver once, so twice
	POSTTRAINLLM_VK_DRIVER=lavapipe $(BIN)/python -m pytest tests/webgpu
	POSTTRAINLLM_VK_DRIVER=swiftshader $(BIN)/python -m pytest tests/webgpu

# --- for learners and maintainers ----------------------------------------------------------
# The contributor's loop: lint, then the unit tests (two at a time) and the notebooks (one at a time) that
# the change since $(BASE), committed or not, can affect; posttrainllm/tools/affected.py says how it
# decides. Tests marked `slow` (a fresh venv, a benchmark, torchrun processes) wait for `make test`.
BASE ?= main
check: export POSTTRAINLLM_DEVICE :=
check: install
	$(BIN)/ruff check .
	@tests="$$($(BIN)/python -m posttrainllm.tools.affected tests --base $(BASE))" && \
	notebooks="$$($(BIN)/python -m posttrainllm.tools.affected notebooks --base $(BASE))" && \
	echo "changed since $(BASE): $$(echo $$tests | wc -w) unit test files and $$(echo $$notebooks | wc -w) notebooks to run" && \
	if [ -n "$$tests" ]; then $(BIN)/python -m pytest $$tests -m "not slow" -n 2 $(DURATIONS); fi && \
	if [ -n "$$notebooks" ]; then $(BIN)/posttrainllm models && $(BIN)/python -m pytest $$notebooks $(NBVAL); fi

# JupyterLab from the reader's install; its own kernel runs the notebooks (no user-wide kernel is registered).
lab: $(VENV)/.reader
	$(BIN)/jupyter lab notebooks/

# Rebuild the WASM trainer (posttrainllm/assets/wasm/*.cpp -> posttrainllm/assets/wasm/dist) with Emscripten, after changing its source.
# The builds are committed, so reading the book needs no toolchain; the tests rebuild them and
# check that the committed files are identical.
wasm: install
	PYTHON=$(abspath $(BIN))/python bash posttrainllm/assets/wasm/build.sh

# Re-execute every notebook in place after changing it or the package (stores outputs and
# widget state); `make test` then checks the stored outputs with nbval.
# Study answers and a record of passed gates of their own, empty: the maintainer's must not reach the outputs.
notebooks: install
	$(BIN)/posttrainllm models
	own=$$(mktemp -d) && POSTTRAINLLM_STUDY_ANSWERS=$$own/answers.json POSTTRAINLLM_PROGRESS=$$own/progress.json \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace $(or $(NOTEBOOKS),notebooks/*.ipynb); \
	  status=$$?; rm -rf $$own; exit $$status

# Keep the timing report of the last `make test` as the one the book shows when built without tests.
notebook-times:
	python3 -c 'import json,subprocess; r=json.load(open("_build/reports/notebook-times.json")); \
	  c=subprocess.run(["git","rev-parse","--short","HEAD"],capture_output=True,text=True).stdout.strip(); \
	  r={"measured": f"`make test` at commit {c}", **r}; open("book/notebook-times.json","w").write(json.dumps(r, indent=2)+"\n")'

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf _build .pytest_cache .ruff_cache
