# The two commands: `make demo` and `make test`. Both install missing Debian
# packages (scripts/install-deps.sh), configure with CMake and build.
# SANITIZE=1 builds with AddressSanitizer + UndefinedBehaviorSanitizer in its own folder.
SANITIZE ?= 0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(SANITIZE),1)
BUILD ?= build-san
CMAKE_FLAGS += -DTP_SANITIZE=ON
else
BUILD ?= build
endif

.PHONY: all deps test-deps configure build test tsan demo install check-rules fuzz fuzz-net bench storm oom swarm swarm-chaos mutate coverage clean format torch-suite

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The tests also use Debian's PyTorch: PyTorch 1.13's own rpc tests and the
# torch cases run against it. `make test` installs it where it can; where it
# cannot (not root, no network) those tests skip, and say so. CI sets
# TP_REQUIRE_TORCH=1: then a missing torch fails, in the install and the tests.
test-deps:
	@scripts/install-deps.sh --tests

# Two test slots per core: most tests wait on sockets, timers and child
# processes (conformance_tcp: 35 s of wall time for 7 s of CPU time); the
# CPU-bound ones (the simulator's swarms, spin, valgrind) take two slots
# each (ctest PROCESSORS 2), so at most one per core runs.
TEST_JOBS ?= $(shell echo $$(( 2 * $(JOBS) )))
test: test-deps build
	@cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) --timeout 600

# ThreadSanitizer on the TCP transport's tests, where threads really run at
# once (the simulator's tasks never do): its own folder, build-tsan. CI runs
# it after the two builds' tests. tests/tsan.supp says why each entry is there.
TSAN_TESTS := test_tcp test_tcp_bounds test_tcp_shm test_tcp_direct test_tcp_etcd test_etcd_store
TSAN_FLAGS := -fsanitize=thread
tsan: deps
	@cmake -S . -B build-tsan -DTP_BUILD_FUZZ=OFF -DCMAKE_C_FLAGS=$(TSAN_FLAGS) \
	  -DCMAKE_EXE_LINKER_FLAGS=$(TSAN_FLAGS) -DCMAKE_SHARED_LINKER_FLAGS=$(TSAN_FLAGS) >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)
	@cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure -j $(JOBS) --timeout 600 -R '^($(shell echo $(TSAN_TESTS) | tr ' ' '|'))$$'

demo: build
	@scripts/demo.sh $(BUILD)

# Installs headers, libraries, tprun, tpsim, pkg-config and CMake files, and the
# Python package where the build's python3 looks for PREFIX (README: Install).
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

check-rules:
	@scripts/check-rules.sh

fuzz: build
	@scripts/fuzz.sh $(BUILD)

# The network-level fuzzer against a live worker and store, always in the
# sanitizer build (build-san, configured and built here): FUZZ_SECONDS.
fuzz-net:
	@JOBS=$(JOBS) scripts/fuzz-net.sh build-san

bench: build
	@scripts/bench.sh $(BUILD)

# Issue 8's storm against a live worker (tests/tcp/net_storm.c): 10,000
# malformed frames and 5,000 idle connections; prints its figures.
storm: build
	@$(BUILD)/tests/tcp/net_storm

# Out of memory at every allocation of a TCP job, one rank at a time
# (tests/tcp/test_tcp_oom.c; make test samples it).
oom: build
	@TP_OOM_EVERY=1 $(BUILD)/tests/tcp/test_tcp_oom

# The long swarm sweep (spec/sim.md SIM-10): SEEDS=A..B, all cores.
SEEDS ?= 1..100000
swarm: build
	@$(BUILD)/tools/tpsim swarm --seeds $(SEEDS) --jobs $(JOBS)

# Issue 9's sweep: every world in chaos mode with rref-heavy calls.
CHAOS_SEEDS ?= 1..10000
swarm-chaos: build
	@$(BUILD)/tools/tpsim swarm --seeds $(CHAOS_SEEDS) --chaos --jobs $(JOBS)

# PyTorch 1.13's own rpc tests in every mode: ours with default options and
# with allow_pickle, and torch itself as the control (issue 20; ~10 min).
torch-suite: build
	@TP_REQUIRE_TORCH=1 scripts/install-deps.sh --tests
	@cd $(BUILD) && PYTHONPATH=$$PWD/python TP_TORCH_SUITE_MODES=default,pickle,control \
	  /usr/bin/python3 -m pytest -q -s -p no:cacheprovider $(CURDIR)/python/tests/torch_suite/suite_torch_rpc.py

# Mutation testing of common/, real/ and python/ (scripts/mutate.py, spec/sim.md
# SIM-11): MUTANTS per folder drawn from MUTATE_SEED; the score per folder.
MUTANTS ?= 20
MUTATE_SEED ?= 1
MUTATE_FOLDERS ?= common,real,python
mutate: deps
	@/usr/bin/python3 scripts/mutate.py --count $(MUTANTS) --seed $(MUTATE_SEED) --jobs $(JOBS) \
	  --folders $(MUTATE_FOLDERS)

# Which lines of the C code make test never runs, per file, and how many of
# mutate's candidates lie on them (scripts/coverage.py; its own folder, build-cov).
coverage: test-deps
	@/usr/bin/python3 scripts/coverage.py --jobs $(JOBS)

format:
	@clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-san build-cov
