# Set-up and main jobs in a local virtual environment (.venv).
# The CPU build of torch is installed first, or pip would pull a multi-GB CUDA build as a dependency
# of stable-baselines3: from a local wheel where pip's find-links (pip config, $$PIP_FIND_LINKS) have one, else from
# PyTorch's CPU wheel index (TORCH_INDEX; `make TORCH_INDEX= install` takes pip's own choice).
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
STAMP = $(VENV)/.installed
# the native engine's build (`make engine`, docs/engine.md)
ENGINE_SOURCES = CMakeLists.txt $(wildcard mooncake_gym/_engine/*.cpp mooncake_gym/_engine/*.hpp)
ENGINE_STAMP = $(VENV)/.engine
TORCH_VERSION ?= 2.13.0
PIP_FIND_LINKS_ALL := $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p")
TORCH_LOCAL_WHEEL := $(firstword $(foreach d,$(subst file://,,$(PIP_FIND_LINKS_ALL)),$(wildcard $(d)/torch-$(TORCH_VERSION)*.whl)))
TORCH_INDEX ?= $(if $(TORCH_LOCAL_WHEEL),,https://download.pytorch.org/whl/cpu)
TORCH_INSTALL = python -m pip install torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: install engine check-native demo test test-ray bench results clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/$(TORCH_INSTALL)
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mooncake-gym compare

# the suite over TEST_WORKERS processes (pytest-xdist; 2 = this project's machines' cores; 7.5 min there)
TEST_WORKERS ?= 2
test: $(ENGINE_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

bench: $(ENGINE_STAMP)
	$(BIN)/mooncake-gym bench

# The native engine (docs/engine.md): `make install` builds it (pip install -e . runs CMakeLists.txt
# through scikit-build-core); after editing mooncake_gym/_engine/*.cpp or *.hpp, `make engine` rebuilds
# it (importing mooncake_gym warns while the built engine is older than its sources).
# $(ENGINE_STAMP) (defined at the top): rebuilt only when the built engine is missing or older than its sources.
$(ENGINE_STAMP): $(STAMP) $(ENGINE_SOURCES)
	$(BIN)/python -W ignore -c "import sys, mooncake_gym._engine as e; sys.exit(not e.available() or e.stale())" || \
		$(BIN)/python -m pip install --no-deps -e .
	touch $@
engine: $(STAMP)
	$(BIN)/python -m pip install --no-deps -e .
	$(BIN)/python -c "import mooncake_gym; print('engine:', mooncake_gym.engine())"
	touch $(ENGINE_STAMP)

# The native engine against the Python reference (CI's last step): the golden runs dumped with the
# reference (MOONCAKE_GYM_ENGINE=python), then checked bit for bit with the default engine; then the
# built wheels (with the extension, and without a compiler) checked for their files (tests/test_engine_build.py).
NATIVE_BUILD = build/native
check-native: $(ENGINE_STAMP)
	mkdir -p $(NATIVE_BUILD)
	$(BIN)/python -c "import mooncake_gym, sys; e = mooncake_gym.engine(); print('engine:', e); sys.exit(e != 'native')"
	MOONCAKE_GYM_ENGINE=python $(BIN)/python benchmarks/golden.py dump $(NATIVE_BUILD)/golden-python.pkl
	$(BIN)/python benchmarks/golden.py check $(NATIVE_BUILD)/golden-python.pkl
	MOONCAKE_WHEEL_BUILD=1 $(BIN)/python -m pytest -q tests/test_engine_build.py

clean:
	rm -rf $(VENV) $(RAY_VENV) build dist *.egg-info

# Ray (RLlib, Tune) in its own venv: Ray installs gymnasium 1.2 over the 1.4 of .venv
# (docs/scale-out.md). CPU torch first, as above.
RAY_VENV ?= .venv-ray
RAY_STAMP = $(RAY_VENV)/.installed

$(RAY_STAMP): pyproject.toml
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install --upgrade pip
	$(RAY_VENV)/bin/$(TORCH_INSTALL)
	$(RAY_VENV)/bin/python -m pip install -e '.[dev,ray]'
	touch $(RAY_STAMP)

# the Ray tests, and the environment and tune tests again under Ray's gymnasium
test-ray: $(RAY_STAMP)
	$(RAY_VENV)/bin/python -m pytest -q tests/test_ray.py tests/test_envs.py tests/test_tune.py

# Regenerate docs/results.md (the tables of `mooncake-gym compare`; the shared-trace part needs
# ../shared/traces/synthetic_trace.jsonl, Mooncake's public synthetic trace).
SHARED_TRACE ?= ../shared/traces/synthetic_trace.jsonl
OBSERVATION_MODES = --observation exact --observation scraped,scrape_delay_s=0.1 --observation scraped,scrape_delay_s=0.5 \
	--observation scraped,scrape_delay_s=0.5,inflight=false --observation approximate --observation precise \
	--observation noisy,noise_sigma=0.3 --observation scraped+approximate+noisy,scrape_delay_s=0.1
# Every routing baseline with knobs is first tuned (`mooncake-gym tune`, training seeds 0-2, exact view) into
# $(TUNE_DIR); the tables then show each at its defaults and tuned (`--tuned`).
TUNE_DIR ?= runs/tuned
TUNED = $$(for f in $(TUNE_DIR)/*.json; do printf -- '--tuned %s ' "$$f"; done)
results: $(STAMP)
	mkdir -p $(TUNE_DIR)
	for p in $$($(BIN)/python -c "from mooncake_gym.baselines import ROUTING_POLICIES as P; print(*[n for n, c in P.items() if getattr(c, 'KNOBS', None)])"); do \
	  $(BIN)/mooncake-gym tune --policy $$p --env routing --out $(TUNE_DIR)/$$p.json --json > /dev/null || exit 1; done
	{ echo "# Results"; echo; \
	  echo "Generated by \`make results\` on $$(date -u +%Y-%m-%d) with mooncake-gym $$($(BIN)/python -c 'import mooncake_gym; print(mooncake_gym.__version__)'). Every policy of a table runs on the same workloads."; echo; \
	  echo "Routing: TTFT SLO 5 s; hit share = input tokens served from a prefix cache; fetched = tokens pulled from other instances over RDMA. Admission: completed = requests that got a decode slot; good requests = those with TTFT <= 30 s; after prefill = rejected after prefill (their prefill is wasted); P/D corr = Pearson correlation of the prefill and decode load series (- where the prefill load never changes, as under baseline). ppo_* rows are the shipped agents whose spaces fit the table (each card in mooncake_gym/agents/ says what it was trained on). NAME (tuned): the routing baseline with the knobs \`mooncake-gym tune --policy NAME --env routing\` found (grid of its KNOBS, mean TTFT over training seeds 0-2 of 1,000-request synthetic episodes at 4 and 8 sessions/s, exact view; \`make results\` writes them to $(TUNE_DIR)/), the same knobs in every table and observation mode."; echo; \
	  echo "## Synthetic workloads (\`mooncake-gym compare --preset lecture --markdown\`)"; echo; \
	  $(BIN)/mooncake-gym compare --preset lecture --markdown --no-progress $(TUNED); echo; \
	  echo "## Mooncake's public synthetic trace at speed 2 (\`mooncake-gym compare --preset lecture --env routing --trace $(SHARED_TRACE) --speed 2 --seeds 1 --markdown\`)"; echo; \
	  $(BIN)/mooncake-gym compare --preset lecture --env routing --trace $(SHARED_TRACE) --speed 2 --seeds 1 --markdown --no-progress $(TUNED); \
	  echo; echo "## Production routers and the TTFT lower bound"; echo; \
	  echo "The production-router baselines (\`dynamo\` ... \`chbl\`) and the \`bound\` row are in the tables above; their rules, sources and a reading of the tables at 4, 8 and 12 sessions/s: [\`production-routers.md\`](production-routers.md)."; echo; \
	  echo "## What the router sees: observation modes (\`mooncake-gym replay --preset lecture --policy all --markdown\` with one \`--observation\` per mode)"; echo; \
	  echo "The same baselines when the router sees stale load, its own prefix index or noisy estimates instead of the exact state (\`mooncake_gym.sim.observation\`; modes and their sources in docs/envs/prefill_routing.md). Only the view changes: every request is served exactly. exact = the exact state, as in the tables above (replay seeds its tie-breaks and synthetic workload with seed 0, the tables above with held-out seeds, so the numbers differ); scraped = load snapshots every 0.1 s seen with the given delay, plus the router's count of what it sent since (inflight=false: without it); approximate = the router's own unbounded index of the blocks it routed; precise = KV events 0.1 s late; noisy = predicted prefill and transfer times x exp(0.3 z)."; echo; \
	  echo "### synthetic, 8 sessions/s, seed 0 (\`--rate 8\`)"; echo; \
	  echo "The tuned rows here are not held out: tuning's episode of seed 0 at 8 sessions/s is the first 1,000 requests of this workload. The trace below was not tuned on."; echo; \
	  $(BIN)/mooncake-gym replay --preset lecture --rate 8 --policy all --markdown $(OBSERVATION_MODES) $(TUNED); echo; \
	  echo "### Mooncake's synthetic trace at speed 2 (\`--trace $(SHARED_TRACE) --speed 2\`)"; echo; \
	  $(BIN)/mooncake-gym replay --preset lecture --trace $(SHARED_TRACE) --speed 2 --policy all --markdown $(OBSERVATION_MODES) $(TUNED); \
	} > docs/results.md

# The long profile of the property-based tests (tests/test_fuzz.py): many more random examples and
# 10^6 checked environment steps over both environments (about 10-20 minutes on two cores).
.PHONY: fuzz
fuzz: $(STAMP)
	MOONCAKE_FUZZ=long $(BIN)/python -m pytest -q tests/test_fuzz.py --hypothesis-show-statistics

# docs/leaderboard.md: every scenario's ranked table (`mooncake-gym compare --scenario all`), with
# every baseline that has knobs tuned on each scenario's training seeds first (`tune --scenario`): the
# routing rules on the routing scenarios, the v1 admission rules on the admission and Conductor
# scenarios (LEADERBOARD_ROUTING_TUNE / LEADERBOARD_ADMISSION_TUNE: `all` or names). Each rule tries at
# most LEADERBOARD_TUNE_BUDGET settings, drawn at random (seeded) from a larger grid, except the rules
# of LEADERBOARD_*_FULL, searched on their whole grids: the best tuned rules, which the agents' targets
# are measured against (LEADERBOARD_TUNE_BUDGET= searches every grid whole).
# `make leaderboard` runs it all in one process (`python -m mooncake_gym.experiments.leaderboard --run`)
# with LEADERBOARD_WORKERS worker processes (the same files whatever their number): it writes the tuned
# knobs to docs/leaderboard/tuned/POLICY-SCENARIO.json (the files `compare --tuned` reads), then the
# page and its tables as data, docs/leaderboard.json. `make leaderboard-tables` remakes the page and
# the data from the tuned files already there. The scenario that replays Mooncake's trace runs where
# $(SHARED_TRACE) exists, and is skipped with the reason otherwise.
.PHONY: leaderboard leaderboard-tables
LEADERBOARD_SEEDS ?= 10
LEADERBOARD_TUNE_SEEDS ?= 3
LEADERBOARD_ADMISSION_TUNE_SEEDS ?= 1
LEADERBOARD_ROUTING_TUNE ?= all
LEADERBOARD_ADMISSION_TUNE ?= all
LEADERBOARD_TUNE_BUDGET ?= 6
LEADERBOARD_ROUTING_FULL ?= kvcentric
LEADERBOARD_ADMISSION_FULL ?= early context_predicted
LEADERBOARD_WORKERS ?= 2
LEADERBOARD_TRACE = $(if $(wildcard $(SHARED_TRACE)),--trace $(SHARED_TRACE),)
LEADERBOARD_RUN = $(BIN)/python -m mooncake_gym.experiments.leaderboard --run --workers $(LEADERBOARD_WORKERS) \
	--seeds $(LEADERBOARD_SEEDS) --tune-seeds $(LEADERBOARD_TUNE_SEEDS) --admission-tune-seeds $(LEADERBOARD_ADMISSION_TUNE_SEEDS) \
	--routing "$(LEADERBOARD_ROUTING_TUNE)" --admission "$(LEADERBOARD_ADMISSION_TUNE)" \
	--routing-full "$(LEADERBOARD_ROUTING_FULL)" --admission-full "$(LEADERBOARD_ADMISSION_FULL)" \
	$(if $(LEADERBOARD_TUNE_BUDGET),--budget $(LEADERBOARD_TUNE_BUDGET),) $(LEADERBOARD_TRACE) \
	--command "make leaderboard LEADERBOARD_SEEDS=$(LEADERBOARD_SEEDS) LEADERBOARD_TUNE_BUDGET=$(LEADERBOARD_TUNE_BUDGET)"
leaderboard: $(ENGINE_STAMP)
	$(LEADERBOARD_RUN)
leaderboard-tables: $(ENGINE_STAMP)
	$(LEADERBOARD_RUN) --tables-only
