#!/usr/bin/env bash
# netns_test.sh: the TCP transport across Linux network namespaces
# (spec/tcp.md TCP-24). Three hosts, h1 h2 h3 (10.77.0.1..3/24), each a
# namespace with one veth into a switch namespace, sw, whose bridge joins
# them; rank r runs on host h(r+1) with `ip netns exec`, rank 0 serving the
# store (env://, MASTER_ADDR 10.77.0.1). Links are cut at the switch, so
# both hosts keep their addresses, routes and carrier, and nothing answers:
#   cut R    rank R's switch port taken out of the bridge (nomaster): it
#            stays up, its frames reach nothing and none reach it; no reset,
#            no ICMP (the neighbours are permanent, so no ARP failure tells
#            the kernel either)
#   cutin R  a pfifo of limit 0 as the root qdisc of R's switch port: what
#            is sent to R is dropped, what R sends goes through
#   heal R   both undone
#   freeze R / thaw R   SIGSTOP / SIGCONT to rank R's process
# Rank 0 (netns_worker.c) drives each scenario and runs those verbs as
# "$0 ctl <prefix> <dir> <verb> <rank>".
#
#   netns_test.sh WORKER [SCENARIO...]   (default: every scenario)
#
# Exit 0 when every scenario passed, 1 when one failed, 77 (skipped) when
# not root or the kernel or tools lack something the suite needs. Every
# namespace it made is deleted on any exit (trap); names carry the pid and
# a random number, so parallel runs do not meet.
set -u

if [ "${1:-}" = ctl ]; then
    # ctl PREFIX DIR VERB RANK: one change to the links (called by rank 0).
    [ $# -eq 5 ] || { echo "netns_test.sh ctl: PREFIX DIR VERB RANK" >&2; exit 2; }
    sw="${2}sw" dir=$3 verb=$4 rank=$5
    port="p$((rank + 1))"
    case $verb in
    cut) ip -n "$sw" link set dev "$port" nomaster ;;
    cutin) tc -n "$sw" qdisc replace dev "$port" root pfifo limit 0 ;;
    heal)
        ip -n "$sw" link set dev "$port" master br0 &&
            { tc -n "$sw" qdisc del dev "$port" root 2>/dev/null; true; }
        ;;
    freeze) kill -STOP "$(cat "$dir/pid.$rank")" ;;
    thaw) kill -CONT "$(cat "$dir/pid.$rank")" ;;
    *) echo "netns_test.sh ctl: unknown verb $verb" >&2; exit 2 ;;
    esac
    exit $?
fi

skip() {
    echo "netns_test.sh: SKIP: $*"
    exit 77
}

[ $# -ge 1 ] || { echo "usage: netns_test.sh WORKER [SCENARIO...]" >&2; exit 2; }
worker=$(readlink -f "$1")
shift
scenarios=${*:-cut blip oneway mid slow sdheal sdcut down rescue}
[ -x "$worker" ] || { echo "netns_test.sh: $worker is not executable" >&2; exit 2; }
[ "$(id -u)" = 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2's ip and tc are needed"

WORLD=3
prefix="tpn$$r$RANDOM-"
self=$(readlink -f "$0")
dir=$(mktemp -d "${TMPDIR:-/tmp}/tp-netns.XXXXXX")
made=()
pids=()

cleanup() {
    for p in "${pids[@]}"; do
        kill -CONT "$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null
    done
    for ns in "${made[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkns() {
    ip netns add "$1" 2>"$dir/err" || return 1
    made+=("$1")
    ip -n "$1" link set dev lo up
}

# The topology; any failure here is the kernel or tools lacking something.
setup() {
    local sw="${prefix}sw" h i j
    mkns "$sw" || return 1
    ip -n "$sw" link add name br0 type bridge || return 1
    ip -n "$sw" link set dev br0 up || return 1
    for i in $(seq 1 $WORLD); do
        h="${prefix}h$i"
        mkns "$h" || return 1
        ip -n "$sw" link add name "p$i" type veth peer name eth0 netns "$h" || return 1
        ip -n "$sw" link set dev "p$i" master br0 up || return 1
        ip -n "$h" link set dev eth0 address "02:77:00:00:00:0$i" up || return 1
        ip -n "$h" addr add "10.77.0.$i/24" dev eth0 || return 1
    done
    # Permanent neighbours: with ARP, a cut host's entry would fail and the
    # kernel would report "no route to host" at once, which no power loss
    # or partition of a real network promises.
    for i in $(seq 1 $WORLD); do
        for j in $(seq 1 $WORLD); do
            [ "$i" = "$j" ] && continue
            ip -n "${prefix}h$i" neigh replace "10.77.0.$j" lladdr "02:77:00:00:00:0$j" \
                dev eth0 nud permanent || return 1
        done
    done
    # The verbs work here before any scenario relies on them.
    "$self" ctl "$prefix" "$dir" cut 0 && "$self" ctl "$prefix" "$dir" cutin 0 &&
        "$self" ctl "$prefix" "$dir" heal 0 || return 1
}

setup 2>>"$dir/err" || skip "cannot build the namespaces: $(tail -n 3 "$dir/err" | tr '\n' ' ')"

secret=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')

# run SCENARIO: one job, a fresh worker per host; 0 when every rank exited 0.
run() {
    local sc=$1 r t0 code=0 deadline
    pids=()
    rm -f "$dir"/pid.* "$dir"/out.*
    t0=$(date +%s%3N)
    for r in $(seq 0 $((WORLD - 1))); do
        ip netns exec "${prefix}h$((r + 1))" env RANK=$r WORLD_SIZE=$WORLD \
            MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 TP_SECRET="$secret" \
            NETNS_ADDR="10.77.0.$((r + 1))" NETNS_KEEPALIVE=1,1,2 \
            NETNS_CTL="$self ctl $prefix $dir" "$worker" "$sc" >"$dir/out.$r" 2>&1 &
        pids+=($!)
        echo $! >"$dir/pid.$r"
    done
    # Each scenario takes 2..12 s; a hung one is killed at 60 s, and the
    # other ranks 15 s after rank 0 (which releases them) has ended.
    deadline=$(($(date +%s) + 60))
    for r in $(seq 0 $((WORLD - 1))); do
        while kill -0 "${pids[$r]}" 2>/dev/null && [ "$(date +%s)" -lt $deadline ]; do
            sleep 0.05
        done
        [ "$r" = 0 ] && deadline=$(($(date +%s) + 15))
        if kill -0 "${pids[$r]}" 2>/dev/null; then
            echo "netns_test.sh: $sc: rank $r still running: killed"
            kill -CONT "${pids[$r]}" 2>/dev/null
            kill -KILL "${pids[$r]}" 2>/dev/null
        fi
        wait "${pids[$r]}"
        local rc=$?
        [ $rc -eq 0 ] || { echo "netns_test.sh: $sc: rank $r exited $rc"; code=1; }
    done
    pids=()
    # Heal whatever a failed run left cut, for the next scenario.
    for r in $(seq 0 $((WORLD - 1))); do
        "$self" ctl "$prefix" "$dir" heal "$r"
    done
    # TCP's view of an asymmetric cut: rank 1 loses its connections to rank 0 too.
    if [ "$sc" = oneway ] && ! grep -q "worker 'worker0' (id 0) is " "$dir/out.1"; then
        echo "netns_test.sh: oneway: rank 1 never saw rank 0 go (its probes' answers were lost)"
        code=1
    fi
    local ms=$(($(date +%s%3N) - t0))
    printf 'netns_test.sh: %s: %s in %d.%03d s\n' "$sc" "$([ $code = 0 ] && echo ok || echo FAILED)" \
        $((ms / 1000)) $((ms % 1000))
    cat "$dir"/out.*
    return $code
}

failed=0
t_all=$(date +%s)
for sc in $scenarios; do
    run "$sc" || failed=1
done
echo "netns_test.sh: $([ $failed = 0 ] && echo 'all passed' || echo 'FAILED') in $(($(date +%s) - t_all)) s"
exit $failed
