#!/usr/bin/env bash
# tpsim_determinism.sh <path-to-tpsim>: the simulator replays (SIM-1..8).
#
# For every scenario tpsim --list prints: two runs with the same seed must
# end with the same trace_hash and write byte-identical traces, a run with
# another seed must give a different trace_hash, and every run must exit 0
# with "trace_hash=<16 hex digits>" as its last line. Prints one PASS/FAIL
# line per scenario, goes through all of them, and exits 1 when one failed,
# 2 on a usage error.
set -uo pipefail

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: $0 <path-to-tpsim>" >&2
    exit 2
fi
tpsim=$1
seed_a=1
seed_b=2

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpsim_determinism.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL $*"
    exit 1
}

# run SCENARIO SEED TAG: runs tpsim, checks the exit status and the last
# line, and leaves the hash in $hash, the trace in $tmp/TAG.trace. Runs in
# a subshell (see check_scenario), so fail ends only that scenario.
run() {
    local out="$tmp/$3.out" rc
    "$tpsim" --scenario "$1" --seed "$2" --trace "$tmp/$3.trace" --wall-limit 60 >"$out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "--- tpsim --scenario $1 --seed $2 exited $rc:"
        grep -E '^(FAIL|tpsim:)' "$out" | head -n 20
        tail -n 3 "$out"
        fail "$1: seed $2: exit status $rc"
    fi
    local last
    last=$(tail -n 1 "$out")
    if ! [[ "$last" =~ ^trace_hash=[0-9a-f]{16}$ ]]; then
        fail "$1: seed $2: last line is '$last', not trace_hash=<16 hex digits>"
    fi
    hash=${last#trace_hash=}
    if [ ! -s "$tmp/$3.trace" ]; then
        fail "$1: seed $2: the trace file is empty"
    fi
}

scenarios=$("$tpsim" --list) || fail "tpsim --list exited $?"
[ -n "$scenarios" ] || fail "tpsim --list printed no scenario"

# check_scenario SCENARIO: the three runs and their comparisons.
check_scenario() {
    local sc=$1 start=$SECONDS h1 h2 h3
    run "$sc" "$seed_a" a1
    h1=$hash
    run "$sc" "$seed_a" a2
    h2=$hash
    run "$sc" "$seed_b" b
    h3=$hash
    [ "$h1" = "$h2" ] || fail "$sc: seed $seed_a gave trace_hash $h1, then $h2"
    cmp -s "$tmp/a1.trace" "$tmp/a2.trace" ||
        fail "$sc: seed $seed_a wrote different traces ($(cmp "$tmp/a1.trace" "$tmp/a2.trace"))"
    [ "$h1" != "$h3" ] || fail "$sc: seeds $seed_a and $seed_b gave the same trace_hash $h1"
    echo "PASS $sc: seed $seed_a -> $h1 twice, seed $seed_b -> $h3 ($((SECONDS - start)) s)"
}

count=0
failed=()
for sc in $scenarios; do
    count=$((count + 1))
    (check_scenario "$sc") || failed+=("$sc")
done
if [ ${#failed[@]} -ne 0 ]; then
    echo "tpsim_determinism: ${#failed[@]} of $count scenarios failed: ${failed[*]}"
    exit 1
fi
echo "tpsim_determinism: $count scenarios replay deterministically"
