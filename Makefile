# Two commands do everything on a fresh machine:
#   make lab    create .venv if missing, install, start JupyterLab on labs/
#   make test   same set-up, then run the test suite
VENV        ?= .venv
PYTHON      ?= python3
TORCH_SPEC  ?= torch==2.13.0
# Extra pip options for the torch install.  A laptop without this course's local
# CPU wheel needs PyTorch's CPU index, or pip fetches the multi-GB CUDA build:
#   make lab TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
CONSTRAINTS ?= constraints/cpu.txt
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.parlab-installed
PYTEST_ARGS ?=

.PHONY: setup lab test test-gpu doctor bench release slides clean-venv hub hub-stop hub-preflight student-dist rehearsal

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "'$(PYTHON) -m venv' failed. On Debian/Ubuntu install its venv module (sudo apt-get install python3-venv), then: rm -rf $(VENV); make $(MAKECMDGOALS)"; exit 1; }
	@$(PY) -m pip --version >/dev/null 2>&1 || { echo "$(VENV) has no pip (made without the venv module?). On Debian/Ubuntu: sudo apt-get install python3-venv; then: rm -rf $(VENV); make $(MAKECMDGOALS)"; exit 1; }
	@echo "parlab: installing $(TORCH_SPEC) and the course packages into $(VENV): about 3 minutes, silent until done (only the first time)"
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[test]"
	@$(PY) -c "import torch, parlab; print('parlab ready: torch', torch.__version__)"
	@touch $(STAMP)

setup: $(STAMP)

# Jupyter refuses to run as root unless told; containers and course VMs often are root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=labs $(LAB_ARGS)

# With no PYTEST_ARGS, the tiers run in two pytest processes at once (scripts/run_tests.py says why
# and which); with PYTEST_ARGS, one pytest with them.
test: setup
	OMP_NUM_THREADS=1 $(PY) scripts/run_tests.py $(PYTEST_ARGS)

# The GPU tier alone (tests/gpu): NCCL launches, tiny models on CUDA, the labs' checks on GPUs.
# Skipped, with the reason, on a machine without CUDA.
test-gpu: setup
	$(PY) -m pytest -m gpu -rs $(PYTEST_ARGS)

doctor: setup
	$(VENV)/bin/parlab doctor

# Regenerate labs/ (the student release) from solutions/ with nbgrader.
release: setup
	$(PY) scripts/release.py

bench: setup
	OMP_NUM_THREADS=1 $(PY) benchmarks/launch_overhead.py

# The lecture deck (slides/README.md): offline HTML and a PDF handout in slides/build/.
# The PDF needs Chromium; without it the build says so and makes the HTML only.
SLIDES_STAMP := $(VENV)/.parlab-slides-installed
$(SLIDES_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[slides]"
	@touch $(SLIDES_STAMP)

slides: $(SLIDES_STAMP)
	$(PY) slides/build.py

# A demo of the course hub (hub/, docs/jupyterhub.md) on 127.0.0.1: an instructor and two
# students as real Unix users (needs root), URL and logins printed; make hub-stop ends it all.
HUB_STAMP := $(VENV)/.parlab-hub-installed
$(HUB_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[hub]"
	@command -v configurable-http-proxy >/dev/null || npm install -g --silent configurable-http-proxy || { echo "make hub needs configurable-http-proxy (npm install -g configurable-http-proxy; Node from Debian: apt-get install nodejs npm)"; exit 1; }
	@touch $(HUB_STAMP)

hub: $(HUB_STAMP)
	$(PY) hub/demo.py start

hub-stop:
	$(PY) hub/demo.py stop

# parlab preflight against the demo hub of make hub (root), as an admin runs it on the course's host:
# one line per check, ok or FAIL with the remedy; the report in /srv/parlab-hub-demo (docs/jupyterhub.md).
hub-preflight:
	$(PY) hub/demo.py preflight

# The day before term, on the DGX, as root, in the course's checkout with the course's hub running: the GPU
# tier, parlab preflight of the deployed environment (PARLAB_ENV) against that hub (PREFLIGHT_ARGS: its options,
# e.g. --url ... --instructor ... --checkout $$PWD) and 30 students at once (benchmarks/hub_load.py), in one
# report file to keep (parlab.preflight.rehearsal; docs/jupyterhub.md, "The day before term").
PARLAB_ENV ?= /opt/conda/envs/parlab
PREFLIGHT_ARGS ?=
REHEARSAL_REPORT ?= /var/log/parlab-rehearsal-$(shell date -u +%Y%m%dT%H%M%SZ).txt
rehearsal: $(HUB_STAMP)
	$(PY) -m parlab.preflight.rehearsal --report $(REHEARSAL_REPORT) --students 30 --gpu-tier "$(MAKE) test-gpu" \
	    --preflight "$(PARLAB_ENV)/bin/parlab preflight $(PREFLIGHT_ARGS)" --load "$(PY) benchmarks/hub_load.py"

clean-venv:
	rm -rf $(VENV)

# What students get (scripts/student_dist.py): a git repository in dist/student with the package and
# labs/, no solutions/ and no tests/; students run `make lab` in it.
student-dist:
	$(PYTHON) scripts/student_dist.py
