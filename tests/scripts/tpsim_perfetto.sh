#!/usr/bin/env bash
# tpsim_perfetto.sh <tpsim> <checker.py>: a 4-worker run with a partition,
# written as Chrome trace-event JSON (spec/sim.md SIM-12), must pass the
# format check, and two runs of the same seed must write the same bytes;
# chaos worlds' traces must pass it too.
set -uo pipefail
if [ $# -ne 2 ] || [ ! -x "$1" ]; then
    echo "usage: $0 <tpsim> <perfetto_check.py>" >&2
    exit 2
fi
tpsim=$1 check=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpsim_perfetto.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
# w2 and w3 lose each other for 3 ms in the middle of the nested chains.
printf 'partition 2 3 2 5\n' > "$tmp/p.plan"
for run in a b; do
    "$tpsim" --scenario nested --workers 4 --seed 5 --faults "$tmp/p.plan" \
        --trace "$tmp/$run.json" > "$tmp/$run.out"
    rc=$?
    # The scenario's own checks assume no faults; the trace is what is tested.
    if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
        echo "FAIL tpsim exited $rc"; cat "$tmp/$run.out"; exit 1
    fi
done
python3 "$check" "$tmp/a.json" --expect-partition || exit 1
cmp -s "$tmp/a.json" "$tmp/b.json" || { echo "FAIL the same seed wrote different JSON"; exit 1; }
# A swarm world whose w1 dies and is restarted (REJOIN): the restart's host
# gets its own named process, and the file still passes the format check.
printf 'kill 1 300\nrestart 1 1000\n' > "$tmp/r.plan"
"$tpsim" swarm --seeds 1 --workers 3 --plan "$tmp/r.plan" --trace "$tmp/r.json" > "$tmp/r.out" ||
    { echo "FAIL the restart world"; cat "$tmp/r.out"; exit 1; }
python3 "$check" "$tmp/r.json" || exit 1
grep -q '"host 3 (rank 1, incarnation 1)"' "$tmp/r.json" ||
    { echo "FAIL the restarted host is not named"; exit 1; }
# Chaos worlds (SIM-14): duplicated, held-back and lost frames. Every
# delivery needs its send (a duplicate has its own), every loss an instant.
for seed in 18 22; do
    "$tpsim" swarm --seeds $seed --workers 4 --chaos --trace "$tmp/c$seed.json" > "$tmp/c.out" 2>&1 ||
        { echo "FAIL chaos seed $seed"; cat "$tmp/c.out"; exit 1; }
    python3 "$check" "$tmp/c$seed.json" --expect-drops || exit 1
done
grep -q '"send (duplicate) type' "$tmp/c18.json" && grep -q '"send (held back) type' "$tmp/c18.json" ||
    { echo "FAIL chaos seed 18 shows no duplicate or held-back frame"; exit 1; }
echo "PASS the same seed writes the same JSON"
