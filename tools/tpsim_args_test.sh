#!/usr/bin/env bash
# tpsim_args_test.sh <path-to-tpsim> <faults-dir>: tpsim's command line.
#
# Every bad argument is rejected with exit status 2 and a message saying
# what is wrong; good forms (--opt value, --opt=value, hex seeds, fault
# plans) run. Exits 1 on the first unexpected result.
set -uo pipefail

if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -d "$2" ]; then
    echo "usage: $0 <path-to-tpsim> <faults-dir>" >&2
    exit 2
fi
tpsim=$1
faults=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpsim_args.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
checks=0

# expect RC PATTERN ARGS...: tpsim ARGS exits RC and its output matches PATTERN.
expect() {
    local want_rc=$1 pattern=$2 rc
    shift 2
    "$tpsim" "$@" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -ne "$want_rc" ] || ! grep -qE -- "$pattern" "$tmp/out"; then
        echo "FAIL tpsim $*: exit $rc (want $want_rc), output should match /$pattern/:"
        head -n 20 "$tmp/out"
        exit 1
    fi
    checks=$((checks + 1))
}

expect 0 '^worker_death$' --list
expect 0 '^seed$' --list
expect 0 'usage: tpsim' --help
expect 2 '--scenario is required' 
expect 2 '--scenario is required' --workers 3
expect 2 "unknown scenario 'nope'" --scenario nope
expect 2 '^fanout$' --scenario nope
expect 2 "needs at least 3 workers, got 2" --scenario remote --workers 2
expect 2 "needs at least 2 workers, got 1" --scenario seed --workers 1
expect 2 "expected an integer from 1" --scenario seed --workers 0
expect 2 "expected an integer from 1" --scenario seed --workers abc
expect 2 "expected an integer from 1" --scenario seed --workers 3x
expect 2 "expected an integer from 1" --scenario seed --workers 99999
expect 2 "expected an integer from 1" --scenario seed --workers -2
expect 2 "expected an unsigned 64-bit" --scenario seed --seed -1
expect 2 "expected an unsigned 64-bit" --scenario seed --seed 12x
expect 2 "expected an unsigned 64-bit" --scenario seed --seed 18446744073709551616
expect 2 "--seed needs a value" --scenario seed --seed
expect 2 "--seed given twice" --scenario seed --seed 1 --seed 2
expect 2 "--scenario given twice" --scenario seed --scenario seed
expect 2 "unknown option '--bogus'" --scenario seed --bogus
expect 2 "unexpected argument 'extra'" --scenario seed extra
expect 2 "expected whole seconds" --scenario seed --wall-limit 1.5
expect 2 "expected whole seconds" --scenario seed --wall-limit 86401
expect 0 '^result=PASS$' --scenario seed --wall-limit 0
expect 2 "--faults $tmp/missing.plan: No such file" --scenario seed --faults "$tmp/missing.plan"
expect 2 "--trace $tmp/no/such/dir/t: No such file" --scenario seed --trace "$tmp/no/such/dir/t"

printf 'delay 0 1 0 10 1\n# fine so far\nfrobnicate 3\n' >"$tmp/bad.plan"
expect 2 "fault plan .*bad.plan: .*line 3" --scenario seed --faults "$tmp/bad.plan"
printf 'kill 1\n' >"$tmp/short.plan"
expect 2 "fault plan .*short.plan: .*line 1" --scenario seed --faults "$tmp/short.plan"

expect 0 '^7$' --scenario=seed --workers=2 --seed=0x2a
expect 0 '^seed=42$' --scenario seed --seed 42
expect 0 '^trace_hash=[0-9a-f]{16}$' --scenario seed --seed 0
expect 0 '^result=PASS$' --scenario fanout --workers 3 --faults "$faults/slow_links.plan"
expect 1 '^result=FAIL$' --scenario remote --workers 3 --faults "$faults/kill_w2.plan"
# Bytes worlds (spec/sim.md SIM-14): a seed saved as bytes replays the same
# world (same trace hash); bytes and seeds do not mix; short bytes still run.
expect 0 '^PASS seed=5 ' swarm --seeds 5 --save-bytes "$tmp/s5.bytes" --verbose
seed_line=$(grep '^PASS seed=5 ' "$tmp/out")
expect 0 '^PASS seed=5 ' swarm --bytes "$tmp/s5.bytes" --verbose
if [ "$(grep '^PASS seed=5 ' "$tmp/out")" != "$seed_line" ]; then
    echo "FAIL: --bytes of seed 5 is another world:"; echo "$seed_line"; grep '^PASS' "$tmp/out"
    exit 1
fi
head -c 8 "$tmp/s5.bytes" >"$tmp/short.bytes" # the seed alone: no draws left, no faults
expect 0 'plan: \(no faults\)' swarm --bytes "$tmp/short.bytes" --verbose
expect 2 "--bytes is the whole world" swarm --bytes "$tmp/s5.bytes" --seeds 5
expect 2 "--bytes $tmp/missing: No such file" swarm --bytes "$tmp/missing"
expect 2 "--bytes given twice" swarm --bytes "$tmp/s5.bytes" --bytes "$tmp/s5.bytes"
expect 2 "--save-bytes takes one seed" swarm --seeds 1..2 --save-bytes "$tmp/x"
expect 1 "save-bytes $tmp/no/dir/x" swarm --seeds 1 --save-bytes "$tmp/no/dir/x"
echo "tpsim_args: $checks checks passed"
