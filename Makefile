# nibble: `make test` installs what is missing, builds and runs every test.
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test test-unit bench fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || (cat $(BUILD).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS) --timeout 900

# The fast in-process tests only (ctest label `unit`, about a minute on 2 cores); the other labels
# (cli, slow, mpi, network, cuda, emulated, isa) are listed at the top of tests/CMakeLists.txt.
test-unit: build
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS) --timeout 900 -L unit

bench: build
	@$(BUILD)/bench/bench_quantize

# nibble's recipes, then PyTorch (fp32, bf16 autocast, bf16 torch.compile) on the same model, batch
# and thread count, and the ratios (`nibble bench train --vs-torch`). Debian's python3-torch by
# default; TORCH_PYTHON=/path/to/venv/bin/python measures another PyTorch release;
# BENCH_TORCH_ARGS adds options (e.g. --torch-modes fp32,bf16 --layers 12 --width 768 ...).
TORCH_PYTHON ?= /usr/bin/python3
BENCH_TORCH_ARGS ?=
.PHONY: bench-torch
bench-torch: build
	@$(BUILD)/nibble bench train --vs-torch --torch-python $(TORCH_PYTHON) $(BENCH_TORCH_ARGS)

# libFuzzer + ASan/UBSan on every reader of user files (.npy, safetensors, run config, token
# shards, llm.c and nanoGPT token files, checkpoints; needs clang-14): the library is built by clang
# with the sanitizers in build-fuzz/, each target runs FUZZ_SECONDS from the seeds in fuzz/corpus/
# (new inputs go to build-fuzz/corpus/, crashes to build-fuzz/); prints the executions each ran and
# fails on a finding.
FUZZ_SECONDS ?= 60
FUZZ_CXX ?= clang++-14
FUZZ_TARGETS ?= npy safetensors config token_shard token_file checkpoint
fuzz: deps
	@cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNIBBLE_FUZZ=ON \
	  -DNIBBLE_CUDA=OFF -DNIBBLE_BUILD_TESTS=OFF -DNIBBLE_BUILD_BENCH=OFF > build-fuzz.configure.log 2>&1 \
	  || (cat build-fuzz.configure.log; exit 1)
	@cmake --build build-fuzz -j$(JOBS) $(foreach t,$(FUZZ_TARGETS),--target fuzz_$(t))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  dict=""; [ -f fuzz/$$t.dict ] && dict="-dict=fuzz/$$t.dict"; \
	  if build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 $$dict \
	       -artifact_prefix=build-fuzz/crash-$$t- build-fuzz/corpus/$$t fuzz/corpus/$$t > build-fuzz/fuzz_$$t.log 2>&1; then \
	    echo "fuzz_$$t: $$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' build-fuzz/fuzz_$$t.log), no findings"; \
	  else \
	    tail -n 40 build-fuzz/fuzz_$$t.log; echo "fuzz_$$t: FINDING (see build-fuzz/fuzz_$$t.log and build-fuzz/crash-$$t-*)"; exit 1; \
	  fi; \
	done

clean:
	rm -rf $(BUILD) $(BUILD).configure.log build-fuzz build-fuzz.configure.log

# The README's second command: installs what is missing, builds the nibble command, prepares the
# shipped Shakespeare text, trains a small model in NVFP4 (a few minutes on a 2-core machine), samples
# it and plots its loss. Re-running continues (or reuses) the same run: resume=true.
DEMO_RUN ?= runs/shakespeare-nvfp4
.PHONY: demo
demo: configure
	@cmake --build $(BUILD) -j$(JOBS) --target nibble
	@# prepared once (re-preparing needs --force; a directory an earlier nibble made, without the
	@# shard list of prepare.json's "shards" (train.bin/val.bin), is rewritten once, to the same tokens
	@# in train-00000.bin/val-00000.bin)
	@grep -qs '"shards"' data/shakespeare_char/prepare.json || $(BUILD)/nibble prepare data/tinyshakespeare.txt -o data/shakespeare_char --force
	@$(BUILD)/nibble train configs/shakespeare.yaml run.dir=$(DEMO_RUN) resume=true
	@echo "--- a sample from $(DEMO_RUN):"
	@$(BUILD)/nibble generate $(DEMO_RUN) --prompt "ROMEO:" --max-tokens 300 --seed 1
	@$(BUILD)/nibble compare $(DEMO_RUN) -o $(DEMO_RUN)-loss.png
	@echo "run directory: $(DEMO_RUN) (config.yaml, metrics.jsonl, checkpoints/, nibble_tokenizer.json); loss plot: $(DEMO_RUN)-loss.png (outside the run: only nibble train writes into a run directory)"
	@echo "next: $(BUILD)/nibble generate $(DEMO_RUN) --prompt \"JULIET:\"; a BF16 baseline to compare with:"
	@echo "  $(BUILD)/nibble train configs/shakespeare.yaml quantization=bf16 run.dir=runs/shakespeare-bf16 && $(BUILD)/nibble compare runs/shakespeare-bf16 $(DEMO_RUN)"
