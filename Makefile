# One entry point for everything a developer or CI runs.
#   make demo   - set up, start a daemon on a temporary home, run two DDP jobs side by side
#   make check  - lint, types and every test (what CI runs)
#   make gpu-check - on a machine with an NVIDIA GPU: ddpq's CUDA paths, one result file
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo check lint typecheck test test-long bench browser systemd slurm clean gpu-check

setup: $(STAMP)

# torch comes from the [train] extra as a range; on the lab's machines pip takes
# the wheel that lies on disk. uv/poetry would download 3 GB instead.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $(STAMP)

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

lint: setup
	$(VENV)/bin/ruff check src tests bench migrations
	$(VENV)/bin/ruff format --check src tests bench migrations

# The tests are held to the same strict level as the package: a test with wrong types
# can pass while testing nothing.
typecheck: setup
	$(VENV)/bin/mypy --strict src tests

# The browser test needs Debian's chromium; installed here when we may (root + apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	      || echo "note: could not install chromium; the browser test will be skipped"; \
	  else echo "note: chromium not installed; the browser test will be skipped"; fi; }

# The service unit's test runs `systemd-analyze verify`, from Debian's systemd package
# (installing it starts nothing); installed here when we may (root + apt).
systemd:
	@command -v systemd-analyze >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; } \
	      || echo "note: could not install systemd; the unit's check will be skipped"; \
	  else echo "note: systemd-analyze not installed; the unit's check will be skipped"; fi; }

# The Slurm tests start a real Slurm on loopback (tests/slurm/cluster.py): Debian's
# slurm-wlm and munge, installed here when we may (root + apt). The daemons are not
# started as services; the tests run their own and stop them.
slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; } \
	      || echo "note: could not install slurm-wlm and munge; the Slurm tests will be skipped"; \
	  else echo "note: Slurm not installed; the Slurm tests will be skipped"; fi; }

# On every core, with a worker more than the cores (pytest-xdist, tests/conftest.py); tests
# that must not run beside each other are in one of tests/conftest.py's GROUPS, which its
# scheduler runs on one worker, and the longest go first.
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= auto
test: setup browser systemd slurm
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)

check: lint typecheck test

# The crash soak's long version (many kill -9 cycles).
test-long: setup
	DDPQ_LONG=1 $(PY) -m pytest -q -m slow

bench: setup
	$(PY) bench/scheduler_bench.py

# Real NVML, ResNet18 on the GPU beside the seed, sharing by memory, the device fence, outside
# use: under 8 minutes on one GPU, results in gpu-check.json. Without a GPU it says so, exit 0.
gpu-check: setup
	$(PY) bench/gpu_check.py --out gpu-check.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .demo
