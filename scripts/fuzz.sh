#!/usr/bin/env bash
# Fuzzes every harness fuzz/fuzz_<surface>.c with AFL++, then reports crashes.
#
# Usage: scripts/fuzz.sh BUILD_DIR
#   Builds an instrumented copy of the library and harnesses with afl-clang-fast
#   (Debian package afl++, installed through scripts/install-deps.sh) in its own
#   folder BUILD_DIR/afl, then runs afl-fuzz on each harness for FUZZ_SECONDS
#   (default 60), starting from its seed corpus fuzz/corpus/<harness>. Findings go
#   to fuzz/findings/<harness> (git-ignored; the previous run's are kept as
#   <harness>.prev). Exits 1 when any harness crashed or hung, listing the inputs.
# Environment: FUZZ_SECONDS (per harness), FUZZ_EXECS (stop a harness early
#   once it ran about this many inputs; the default is no such stop), FUZZ_ONLY="fuzz_a fuzz_b" to fuzz only
#   those harnesses, FUZZ_ASAN=0 to build without AddressSanitizer (faster, finds
#   less), AFL_CC to use another AFL++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/fuzz.sh BUILD_DIR}
seconds=${FUZZ_SECONDS:-60}
execs_cap=()
if [ -n "${FUZZ_EXECS:-}" ]; then execs_cap=(-E "$FUZZ_EXECS"); fi
asan=${FUZZ_ASAN:-1}
cc=${AFL_CC:-afl-clang-fast}

scripts/install-deps.sh afl++
command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (package afl++)" >&2; exit 1; }
command -v afl-fuzz >/dev/null || { echo "fuzz: afl-fuzz not found (package afl++)" >&2; exit 1; }

harnesses=()
for src in fuzz/fuzz_*.c; do
  [ -e "$src" ] && harnesses+=("$(basename "$src" .c)")
done
[ ${#harnesses[@]} -gt 0 ] || { echo "fuzz: no harness in fuzz/" >&2; exit 1; }
if [ -n "${FUZZ_ONLY:-}" ]; then
  for h in $FUZZ_ONLY; do
    [ -e "fuzz/$h.c" ] || { echo "fuzz: FUZZ_ONLY names $h, which is not fuzz/$h.c" >&2; exit 1; }
  done
  read -r -a harnesses <<< "$FUZZ_ONLY"
fi

# The instrumented build: its own folder and compiler; no unit tests.
afl_build="$build/afl"
if [ "$asan" = 1 ]; then export AFL_USE_ASAN=1 AFL_USE_UBSAN=1; fi
cmake -S . -B "$afl_build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTP_BUILD_TESTS=OFF -DTP_BUILD_FUZZ=ON -DTP_SANITIZE=OFF >/dev/null
cmake --build "$afl_build" -j "$(nproc 2>/dev/null || echo 2)" --target "${harnesses[@]}"

# afl-fuzz refuses to start in containers unless told not to mind these.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
export AFL_NO_AFFINITY=1 AFL_SKIP_CRASHES=0
# ASan under AFL: no memory limit, abort on error so AFL sees a crash.
export ASAN_OPTIONS="abort_on_error=1:symbolize=0:detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1"

bad=0
for h in "${harnesses[@]}"; do
  corpus="fuzz/corpus/$h"
  if [ ! -d "$corpus" ] || [ -z "$(ls -A "$corpus")" ]; then
    echo "fuzz: $h has no seed corpus in $corpus; skipped" >&2
    continue
  fi
  out="fuzz/findings/$h"
  mkdir -p fuzz/findings
  if [ -d "$out" ]; then rm -rf "$out.prev"; mv "$out" "$out.prev"; fi
  # Per-input time limit. "N+" lets AFL++ pick one from the seeds' timing,
  # at most N: right for a frame decoder. A whole simulated world
  # (fuzz_sim_world, fuzz_core_frames) takes up to about 0.3 s plain and 20 s under ASan (a
  # fiber switch costs more there), far beyond its seeds' timing, so it gets
  # a fixed limit; with "+" AFL++ picked 260 ms and called slow worlds hangs.
  # fuzz_tcp_crypt's seeds run in a few ms, so AFL++ picked 40 ms, which
  # its largest inputs (256 KiB sealed, read a byte at a time) pass under
  # load: each timeout restarts the target, and it ran 36 inputs a second
  # instead of about 450 with 500 ms.
  # fuzz_tcp_conn runs a live TCP job: its first input waits for init, and an
  # input after which worker 0 no longer reaches worker 1 restarts the job
  # (shutdown, up to 40 s); its own deadlines catch a stalled reader.
  case "$h" in
    fuzz_sim_world | fuzz_core_frames) limit=$([ "$asan" = 1 ] && echo 60000 || echo 5000) ;;
    fuzz_tcp_conn) limit=120000 ;;
    fuzz_tcp_crypt) limit=$([ "$asan" = 1 ] && echo 500 || echo 100) ;;
    *) limit=1000+ ;;
  esac
  echo "fuzz: $h for ${seconds}s (findings in $out)" >&2
  afl-fuzz -V "$seconds" ${execs_cap[@]+"${execs_cap[@]}"} -m none -t "$limit" -i "$corpus" -o "$out" -- "$afl_build/fuzz/$h" \
    > "$out.log" 2>&1 || { echo "fuzz: afl-fuzz failed for $h; see $out.log" >&2; tail -20 "$out.log" >&2; bad=1; continue; }
  crashes=$(find "$out" -path '*/crashes/id:*' -type f | sort)
  hangs=$(find "$out" -path '*/hangs/id:*' -type f | sort)
  stat() { sed -n "s/^$1 *: *//p" "$out"/default/fuzzer_stats 2>/dev/null || echo '?'; }
  execs=$(stat execs_done)
  speed=$(stat execs_per_sec)
  paths=$(stat corpus_count)
  ncrash=$(printf '%s' "$crashes" | grep -c . || true)
  nhang=$(printf '%s' "$hangs" | grep -c . || true)
  echo "fuzz: $h: $execs runs ($speed/s), $paths paths, $ncrash crashes, $nhang hangs"
  if [ "$ncrash" -gt 0 ] || [ "$nhang" -gt 0 ]; then
    bad=1
    printf '%s\n' $crashes $hangs | sed 's/^/  /'
    echo "  reproduce: $build/fuzz/$h <file>   (the plain replay build)"
  fi
done
exit $bad
