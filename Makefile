# The two README commands: `make demo` and `make test`. Each installs what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python
TBA := $(VENV)/bin/tba
PYTEST_ARGS ?=
PY_DIRS := tba services tests benchmarks experiments reliability scripts

.PHONY: install test test-fast demo up down bench experiment lint lock clean fuzz soak security tensorboard

install:
	@./scripts/bootstrap.sh

test: install
	@./scripts/test-tools.sh
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	@./scripts/test-tools.sh
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: install
	$(TBA) up

# make demo-real [MINUTES=45]: SmolLM2-135M-Instruct learns reasoning-gym's aiw for 20 minutes, or MINUTES
# (tba/local/profiles/real-model.toml; without bfloat16 in hardware give it 45: docs/models.md)
.PHONY: demo-real
demo-real: install
	$(TBA) up --profile real-model $(if $(MINUTES),--minutes $(MINUTES))

# make bench [MODEL=smollm2-135m-instruct]: MODEL (a directory or a packaged name) measures trainer and searcher on it
bench: install
	$(PY) -m benchmarks.run $(if $(MODEL),--model $(MODEL))

# Reliability suites (reliability/*.py): each rewrites its section of RELIABILITY.md.
fuzz: install
	$(PY) -m reliability.fuzz

# make soak [MINUTES=30]
soak: install
	$(PY) -m reliability.soak $(if $(MINUTES),--minutes $(MINUTES))

security: install
	$(PY) -m reliability.security

# make chaos [MINUTES=12 KILLS=3 SEED=0]
.PHONY: chaos
chaos: install
	$(PY) -m reliability.chaos $(if $(MINUTES),--minutes $(MINUTES)) $(if $(KILLS),--kills $(KILLS)) $(if $(SEED),--seed $(SEED))

# make lint: what .pre-commit-config.yaml runs on a commit, over the whole tree (ruff's lint and format, mypy)
lint: install
	$(VENV)/bin/ruff check $(PY_DIRS)
	$(VENV)/bin/ruff format --check $(PY_DIRS)
	$(VENV)/bin/mypy
	$(PY) scripts/check_layers.py

# make tensorboard [RUNS=runs]: TensorBoard over every run's event files (the trainer's steps, the evaluations)
tensorboard: install
	$(VENV)/bin/tensorboard --logdir $(or $(RUNS),runs) --host 127.0.0.1

lock:
	$(VENV)/bin/pip freeze --exclude-editable | grep -v -E '^(tba==|torchvision|torchaudio|torchcodec)' > requirements/cpu.txt

clean:
	rm -rf $(VENV) .pytest_cache runs

# make experiment [SEEDS=3] [ONLY="decoupling diversity redteam"]: the paper's claims (experiments/run.py, ~3.5 h)
experiment: install
	$(PY) -m experiments.run $(if $(SEEDS),--seeds $(SEEDS)) $(if $(ONLY),--only $(ONLY))

# --- Containers: docker-compose.yml on a GPU host; CPU=1 on a host without one ---
# make up [CPU=1 SEARCHERS=2] [OPENENV=1] / make down / make images / make smoke (the CI container run)
# OPENENV=1: an OpenEnv environment server beside the searchers (docker-compose.openenv.yml)
SEARCHERS ?= 2
COMPOSE_FILES = $(if $(CPU),-f docker-compose.cpu.yml) $(if $(OPENENV),-f docker-compose.openenv.yml)
COMPOSE = docker compose $(if $(strip $(COMPOSE_FILES)),-f docker-compose.yml $(COMPOSE_FILES))
.PHONY: images smoke

images: install
	@scripts/docker/engine.sh start
	@scripts/docker/build.sh $(if $(CPU),--cpu) $(if $(OPENENV),-f docker-compose.openenv.yml)

up: images
	$(COMPOSE) up -d --wait --wait-timeout 900 $(if $(CPU),--scale searcher=$(SEARCHERS))

down:
	$(COMPOSE) down --remove-orphans

smoke: install
	@scripts/docker-smoke.sh
