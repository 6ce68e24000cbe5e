#!/usr/bin/env bash
# make fuzz-net: the network-level fuzzer (fuzz/net_fuzz.c) against a live
# job's worker and store, in the sanitizer build (fuzz/README.md).
#
# Usage: scripts/fuzz-net.sh [BUILD_DIR]   (default build-san)
#   Configures BUILD_DIR with TP_SANITIZE=ON (ASan + UBSan) if needed, builds
#   only net_fuzz, and runs it for FUZZ_SECONDS (default 60). Its children's
#   stderr and any failure's last streams go to fuzz/findings/net/
#   (git-ignored). Exits 1 on a finding: a crash, a sanitizer or assertion
#   report, a leak at exit, a stream the other end did not close after our
#   FIN, or a wrong or stalled call of the well-behaved worker.
# Environment: FUZZ_SECONDS, FUZZ_SEED (to replay a run: its streams depend
#   only on the seed), JOBS (build parallelism, default the CPU count).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-san}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

scripts/install-deps.sh
cmake -S . -B "$build" -DTP_SANITIZE=ON >/dev/null
cmake --build "$build" -j "$jobs" --target net_fuzz

# Sanitizer reports go to the children's stderr (the log the driver reads);
# a report ends the process, and LeakSanitizer checks every child at exit.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
args=(--seconds "${FUZZ_SECONDS:-60}" --findings fuzz/findings/net)
[ -n "${FUZZ_SEED:-}" ] && args+=(--seed "$FUZZ_SEED")
exec "$build/fuzz/net_fuzz" "${args[@]}"
