# hvdtrain: `make demo` sets up and trains the MNIST example on 2 ranks;
# `make test` sets up and runs the whole test suite.
VENV := .venv
PY := $(VENV)/bin/python
NP ?= 2

.PHONY: install demo test unit parallel bench check-gpu-build clean

install:
	bash scripts/install.sh

demo: install
	$(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo $(PY) examples/mnist.py --metrics-out runs/demo/metrics.json --save runs/demo/network.keras

test: install
	$(PY) -m pytest tests -n 2 --dist loadgroup

unit: install
	$(PY) -m pytest tests/unit

parallel: install
	$(PY) -m pytest tests/parallel

check-gpu-build: install
	bash scripts/check_gpu_build.sh

bench: install
	$(VENV)/bin/hvdtrain bench --np 1 2

clean:
	rm -rf $(VENV) .pytest_cache runs
