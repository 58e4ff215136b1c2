# The README's two commands: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
UV     := 0.13.9

# The harness CLIs the examples run unmodified (Claude Code, Codex): pinned in examples/npm/package-lock.json and
# installed into examples/npm/node_modules, never globally. Put examples/npm/node_modules/.bin on PATH to use them.
.PHONY: setup system browser containers images harnesses test lint run kafka-up kafka-down kafka-status bench lock clean

setup: system $(VENV)/.installed

# HAProxy fronts gateway replicas (TETHER_STACK_GATEWAY_REPLICAS, and their tests); bubblewrap makes each local
# rollout's sandbox (infra/sandbox): Debian's packages, installed here when we may (root with apt-get), else named.
system:
	@command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing haproxy (Debian)"; apt-get update -qq && apt-get install -y -qq haproxy >/dev/null; \
	  else echo "make: gateway replicas need HAProxy: install it (Debian: sudo apt-get install haproxy)"; exit 1; fi; }
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing bubblewrap (Debian)"; apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "make: the rollouts' sandbox needs bubblewrap: sudo apt-get install bubblewrap"; exit 1; fi; }

# One resolve against the lock file (uv, no backtracking); re-runs when either file changes.
# Bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set nothing caches it later, and every
# harness process would compile the openai SDK again (1.3 s of CPU per rollout instead of 0.6 s).
$(VENV)/.installed: pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found: Tether needs Python 3.11 (make PYTHON=/path/to/python3.11)"; exit 1; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==$(UV)
	$(BIN)/uv pip install --compile-bytecode --python $(BIN)/python --constraint requirements.lock -e '.[all,test]'
	@touch $@

# `tether view` is tested in headless Chromium (Debian's chromium and chromium-driver): installed here when we may
# (root with apt-get); elsewhere its tests are skipped, saying so, until you install them
# (Debian: sudo apt-get install chromium chromium-driver).
browser:
	@command -v chromedriver >/dev/null || [ -x /usr/bin/chromedriver ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing chromium and chromium-driver (Debian)"; \
	    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "make: browser tests need Chromium: sudo apt-get install chromium chromium-driver (skipped until then)"; fi; }

# The images are built with podman from a Debian base made by mmdebstrap (no Docker daemon, no registry of images):
# installed here when we may (root with apt-get); elsewhere the image tests are skipped, saying so.
containers:
	@command -v podman >/dev/null && command -v mmdebstrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing podman, runc and mmdebstrap (Debian)"; \
	    apt-get update -qq && apt-get install -y -qq podman runc mmdebstrap uidmap >/dev/null; \
	  else echo "make: the images need podman and mmdebstrap: sudo apt-get install podman runc mmdebstrap uidmap"; fi; }

# One image per role (infra/images/), and the two of a coding task's pod (the tasks' image holds examples/swe/tasks,
# built here from toolz on PyPI where they are missing): the sizes and build times are printed, and kept in
# bench/results/images.json.
images: setup containers
	@test -f examples/swe/tasks/tasks.jsonl || $(BIN)/tether swe build --package toolz==1.2.0 --out examples/swe/tasks
	$(BIN)/python -m infra.images.build

harnesses: examples/npm/node_modules/.installed

examples/npm/node_modules/.installed: examples/npm/package.json examples/npm/package-lock.json
	@command -v npm >/dev/null || { echo "make: the Claude Code and Codex examples need Node.js and npm (Debian: apt-get install nodejs npm)"; exit 1; }
	cd examples/npm && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint harnesses browser containers
	$(BIN)/pytest

run: setup
	LITELLM_LOCAL_MODEL_COST_MAP=True $(BIN)/tether demo

kafka-up: setup
	$(BIN)/tether kafka up
	$(BIN)/tether topics create

kafka-down: setup
	$(BIN)/tether kafka down

kafka-status: setup
	$(BIN)/tether kafka status

bench: setup harnesses
	$(BIN)/python bench/bus_throughput.py
	$(BIN)/python bench/engine_throughput.py
	$(BIN)/python bench/gateway_overhead.py
	$(BIN)/python bench/peer_gateway.py
	$(BIN)/python bench/context_cost.py
	$(BIN)/python bench/controller_launch.py
	$(BIN)/python bench/pipeline_throughput.py
	$(BIN)/python bench/trainer_step.py
	$(BIN)/python bench/async_vs_sync.py
	$(BIN)/python bench/harness_clis.py
	$(BIN)/python bench/harness_divergence.py
	$(BIN)/python bench/long_prompts.py
	$(BIN)/python bench/update_backends.py
	$(BIN)/python bench/lora.py
	$(BIN)/python bench/episode_scaling.py
	$(BIN)/python bench/token_encoding.py
	$(BIN)/python bench/faust_floor.py
	$(BIN)/python bench/swe_grading.py

lock: setup
	$(BIN)/uv pip compile pyproject.toml --extra all --extra test --python-version 3.11 -o requirements.lock

clean:
	-$(BIN)/tether kafka down
	rm -rf $(VENV) .tether
