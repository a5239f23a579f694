# The two set-up commands of the README, plus a few conveniences. PYTHON may point at any Python >= 3.10.
PYTHON ?= python3
DEMO_DIR ?= runs/demo

.PHONY: install demo test test-all test-matrix lint bench

install:
	$(PYTHON) -m pip install -q -e ".[test]"

# A short FFM+SAC run on Pendulum-V (a few minutes on a laptop CPU), then its learning curve.
demo: install
	$(PYTHON) -m pomdp_ffm.train env=Pendulum-V-v0 algo=sac seq_model=ffm seed=0 \
		train.num_iters=15 train.batch_size=16 train.sampled_seq_len=64 hydra.run.dir=$(DEMO_DIR)/run resume=true
	$(PYTHON) -m analysis lines $(DEMO_DIR)/run --out $(DEMO_DIR)/report --curves runmax
	@echo "log: $(DEMO_DIR)/run/progress.csv   plot: $(DEMO_DIR)/report/figures/"

# The style first (ruff, configured in pyproject.toml; a second), then the default suite, on two cores at once (about
# 4 minutes on a 2-core machine); `make test-all` adds the tests marked slow (CI runs it: .ci/run), also on two
# cores; `make test-matrix` runs the default suite under the CPU's other kernel paths (tests/kernel_matrix.sh).
test: install lint
	$(PYTHON) -m pytest -q -m "not slow" -n 2 --dist worksteal --durations=25

test-all: install lint
	$(PYTHON) -m pytest -q -n 2 --dist worksteal --durations=25

test-matrix: install
	bash tests/kernel_matrix.sh $(PYTHON)

lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

bench: install
	$(PYTHON) -m pomdp_ffm.bench memory
	$(PYTHON) -m pomdp_ffm.bench update
