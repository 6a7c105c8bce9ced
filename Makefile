# make test: the one command a newcomer runs. It creates .venv, installs resumeq with its
# dev extras, makes sure a redis-server binary exists (the tests start their own servers
# on free ports), Debian's chromium (the browser tests) and Debian's nginx (the tests run
# resumeq serve behind it), and runs lint, type checks and the whole suite.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo docs lint typecheck pytest redis-server chromium nginx bench soak clean

test: lint typecheck pytest

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "resumeq needs Python 3.11 or newer (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "redis-server missing: installing Debian's package"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server not found: install it first (sudo apt-get install redis-server)"; exit 1; \
	  fi; }
	@redis-server --version

# The console's browser tests drive the system's chromium (Playwright never downloads one).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "chromium missing: installing Debian's package"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium not found: install it first (sudo apt-get install chromium)"; exit 1; \
	  fi; }
	@chromium --version

# The reverse-proxy tests start their own nginx on a free port, in a directory of their own;
# a system service the package may have started is left alone, as redis-server's is.
nginx:
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "nginx missing: installing Debian's package"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
	  else \
	    echo "nginx not found: install it first (sudo apt-get install nginx)"; exit 1; \
	  fi; }
	@PATH="$$PATH:/usr/sbin" nginx -v

demo: $(STAMP)
	$(BIN)/resumeq demo

# docs/jobspec.md is written from the model (resumeq/docs.py); tests/test_docs.py fails when
# the two disagree.
docs: $(STAMP)
	$(BIN)/python -m resumeq.docs > docs/jobspec.md

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy --strict resumeq

# Two workers: most tests wait on processes and sockets, and every test starts its own
# servers on free ports, so they run side by side (plain `pytest` runs them one by one).
# The CPU-bound ones (xdist_group "cpu-heavy") run on one worker, one after the other:
# their bounds on a busy process's lag do not hold with two of them at once.
pytest: $(STAMP) redis-server chromium nginx
	$(BIN)/pytest -n 2 --dist loadgroup

# Reduced sizes (about 7 minutes in all); BENCHMARKS.md has the full-size commands.
bench: $(STAMP) redis-server
	$(BIN)/python benchmarks/flush.py
	$(BIN)/python benchmarks/recovery.py --kills 5
	$(BIN)/python benchmarks/cost.py --jobs 20 --repeats 1
	$(BIN)/python benchmarks/cost_tools.py --jobs 20 --repeats 1
	$(BIN)/python benchmarks/overhead.py --tokens 5000 --repeats 3
	$(BIN)/python benchmarks/throughput.py --jobs 100 --repeats 1
	$(BIN)/python benchmarks/memory.py --quick
	$(BIN)/python benchmarks/concurrency.py --quick
	$(BIN)/python benchmarks/splice_corpus.py --seeds 1 --cuts 100
	$(BIN)/python benchmarks/estimates.py --cuts 2000
	$(BIN)/python benchmarks/footprint.py --jobs 5
	$(BIN)/python benchmarks/console.py --jobs 1000 --spilled 100 --requests 10

soak: $(STAMP) redis-server
	$(BIN)/python benchmarks/chaos.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
