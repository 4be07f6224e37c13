# One-command entry points. Every target first makes sure the virtual
# environment in .venv matches pyproject.toml; that step is skipped when
# nothing changed, so the second run is quick.
#
#   make lab       set up, then open JupyterLab on your own copy of the exercises (in my-notebooks/)
#   make lab-instructor  open JupyterLab on the instructor notebooks (with solutions, in notebooks/)
#   make test      set up, then run the whole test suite (what CI runs)
#   make execute   re-execute notebooks in place (NB=notebooks/00_....ipynb for one)
#   make bench     time every notebook and training run against the budgets; README table
#   make test-cpus check that compared outputs hold with MKL on another code path (another CPU)
#   make data      regenerate the committed splits in data/ (deterministic)
#   make release   write the student version (no solutions) to build/release
#   make grade     autograde SUBMISSIONS=folder (one sub-folder per student); MARKS=file adds hand marks;
#                  JOBS=n students at once (default: one per core); SHARD=i/N one share of the class, OUT=folder
#   make grade-merge  merge the folders of a class's shards (SHARDS="f0 f1 ..."; default build/grading-shard-*)
#   make bench-grading  seconds to grade one student's notebooks, per notebook, and JOBS=2 against JOBS=1
#                  (ONE=1: one student only, a few minutes)
#   make site      the executed notebooks as a static web site in build/site (Sphinx + MyST-NB; offline)
#   make slides    turn the notebooks into reveal.js decks in build/slides
#   make browser-test  notebook 00 in JupyterLab, the site and the slides in headless Chromium (needs apt's chromium)

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# nbgrader shells out to alembic: the environment's bin/ must be on PATH.
export PATH := $(abspath $(BIN)):$(PATH)
# Same settings when executing and when checking notebooks (see tests/conftest.py).
export PYTHONHASHSEED := 0
export IPYKERNEL_CELL_NAME := <IPY-INPUT>
unexport MPLBACKEND

NB ?= notebooks
SUBMISSIONS ?= submissions
WORKERS ?= 2

.PHONY: setup lab lab-instructor test test-fast test-cpus execute bench bench-grading data release grade grade-merge site slides \
	browser-test clean

setup: $(STAMP)

$(STAMP): pyproject.toml course_utils/core/portable.py
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (found %s); set PYTHON=/path/to/python3.11" % sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	@# The kernel JupyterLab starts gets the pinned CPU code paths (course_utils/core/portable.py).
	$(BIN)/python -c "from course_utils.core.portable import main; main(['--install-kernel'])"
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
		> $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $@

# JupyterLab refuses to start as root (containers, some CI) unless told.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# The course works offline: no news feed, no update checks.
LAB_OFFLINE := --LabApp.news_url=None \
	--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate

# The learner's kernel keeps IPython's own cell names: with the tests' fixed name, a traceback through a
# function defined in an earlier cell cannot show that cell's line.
LAB_ENV := env -u IPYKERNEL_CELL_NAME

# Extra JupyterLab options, e.g. LAB_ARGS="--no-browser --port=8890" (the browser test uses it).
LAB_ARGS ?=

# A learner's copy of the student version: written once, then kept (a notebook you edited is never overwritten).
LEARNER ?= my-notebooks

lab: setup
	$(BIN)/python -m course_utils.tooling.grading release --out "$(LEARNER)" --quiet --self-study
	$(LAB_ENV) $(BIN)/jupyter lab $(ROOT_FLAG) $(LAB_OFFLINE) $(LAB_ARGS) --notebook-dir=. "$(LEARNER)/00_orientation.ipynb"

lab-instructor: setup
	$(LAB_ENV) $(BIN)/jupyter lab $(ROOT_FLAG) $(LAB_OFFLINE) $(LAB_ARGS) --notebook-dir=. notebooks/00_orientation.ipynb

test: setup
	@$(BIN)/python -c "from course_utils.core.portable import main; main(['--describe'])"
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope

# A stand-in for another CPU: every notebook under strict nbval with MKL on another code path.
test-cpus: setup
	$(BIN)/python -m pytest -n $(WORKERS) tests/cpu_standin_check.py

test-fast: setup
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope -m "not slow" tests

execute: setup
	$(BIN)/python -m course_utils.tooling.execute $(NB)

bench: setup
	$(BIN)/python -m course_utils.tooling.bench $(NB)

data: setup
	$(BIN)/python -c "from course_utils.experiments.training import write_splits; [print(p) for p in write_splits()]"

release: setup
	$(BIN)/python -m course_utils.tooling.grading release --out build/release

grade: setup
	$(BIN)/python -m course_utils.tooling.grading autograde "$(SUBMISSIONS)" $(if $(MARKS),--marks "$(MARKS)",) \
		$(if $(JOBS),--jobs $(JOBS),) $(if $(SHARD),--shard $(SHARD),) $(if $(OUT),--out "$(OUT)",)

grade-merge: setup
	$(BIN)/python -m course_utils.tooling.grading merge $(SHARDS) $(if $(MARKS),--marks "$(MARKS)",) \
		$(if $(OUT),--out "$(OUT)",)

bench-grading: setup
	$(BIN)/python -m course_utils.tooling.bench_grading $(if $(ONE),--one,)

site: setup
	$(BIN)/python -m course_utils.tooling.site --out build/site

slides: setup
	$(BIN)/python -m course_utils.tooling.slides --out build/slides

browser-test: site slides
	$(BIN)/python -m pytest tests/browser_check.py tests/browser_site_check.py -q

clean:
	rm -rf build
