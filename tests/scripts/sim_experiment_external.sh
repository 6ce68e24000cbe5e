#!/bin/sh
# sim_experiment_external.sh BUILD_DIR SOURCE_DIR: a user's own experiment
# (spec/sim.md SIM-15) built outside the tree against the installed library.
#
# Installs BUILD_DIR into a scratch prefix, compiles examples/sim_experiment.c
# there with nothing but the installed headers, libraries and pkg-config
# files, runs 100 seeds (all must pass), then the same program with a planted
# bug (COUNTER_BUG=1), which the experiment's own end check must catch: exit 1
# with a replay line.
set -u
build=${1:?usage: $0 BUILD_DIR SOURCE_DIR}
src=${2:?usage: $0 BUILD_DIR SOURCE_DIR}
cc=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp_experiment.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null || { echo "install failed"; exit 1; }
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
cp "$src/examples/sim_experiment.c" "$tmp/"
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror -o "$tmp/exp" "$tmp/sim_experiment.c" \
    $(pkg-config --static --cflags --libs tensorplay-rpc-sim) || { echo "build failed"; exit 1; }
"$tmp/exp" --seeds 1..100 >"$tmp/ok.out" 2>&1
rc=$?
grep -m1 " seeds (" "$tmp/ok.out"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: the experiment failed on a sound counter (exit $rc):"
    grep -A2 '^FAIL' "$tmp/ok.out" | head -n 12
    exit 1
fi
COUNTER_BUG=1 "$tmp/exp" --seeds 1..10 >"$tmp/bug.out" 2>&1
rc=$?
if [ "$rc" -ne 1 ] || ! grep -q 'the counter is' "$tmp/bug.out" ||
    ! grep -q "replay: $tmp/exp --seeds" "$tmp/bug.out"; then
    echo "FAIL: the planted bug was not caught as it should be (exit $rc):"
    head -n 20 "$tmp/bug.out"
    exit 1
fi
grep -m1 '^FAIL' "$tmp/bug.out"
echo "sim_experiment_external: built against the installed library; 100 seeds passed; the planted bug was caught"
