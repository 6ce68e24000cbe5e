#!/usr/bin/env bash
# spin_rref.sh MODEL: checks the rref protocol's Promela model (spec/rref.pml,
# issue 9 item 5) with spin: both claims must hold on the model as written,
# with reordering (CHAOS), duplication (CHAOS_DUP) and silent loss (LOSS),
# and each deliberately broken variant must be caught, so a pass is evidence.
set -uo pipefail
model=${1:?usage: spin_rref.sh spec/rref.pml}
command -v spin >/dev/null || { echo "spin_rref: spin not found (Debian package spin)" >&2; exit 1; }
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$model" "$work/rref.pml"
cd "$work" || exit 1
fail=0

# build CONFIG: spin's verifier for one configuration (both claims in it).
build() {
  rm -f pan pan.* ./*.trail
  spin $1 -a rref.pml >spin.log 2>&1 || { cat spin.log >&2; echo "spin_rref: spin -a $1 failed" >&2; return 1; }
  $cc -O2 -w -DVECTORSZ=2048 -DCOLLAPSE -o pan pan.c >cc.log 2>&1 || { cat cc.log >&2; return 1; }
}

# errors CLAIM: prints the error count of one verification run of ./pan.
errors() {
  ./pan -a -f -m100000 -N "$1" >pan.log 2>&1
  local e
  e=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.log | head -1)
  if grep -q "search depth too small\|max search depth too small" pan.log; then e=X; fi
  echo "${e:-X}"
}

check() { # check WANT(hold|caught) CONFIG...
  local want=$1 cfg=$2 total=0 bad=0 n
  build "$cfg" || bad=1
  for claim in once_each eventually_freed; do
    [ "$bad" = 1 ] && break
    n=$(errors "$claim")
    [ "$n" = X ] && bad=1 && continue
    total=$((total + n))
    [ "$want" = caught ] && [ "$total" -gt 0 ] && break # caught: no need for the other
  done
  local got=hold
  [ "$total" -gt 0 ] && got=caught
  [ "$bad" = 1 ] && got=error
  if [ "$got" = "$want" ]; then
    echo "ok   ${cfg:-(as written)}: $got"
  else
    echo "FAIL ${cfg:-(as written)}: wanted $want, got $got"
    sed -n '1,40p' pan.log
    fail=1
  fi
}

# Loss, duplication and reordering (issue 9): the network copies, reorders
# and drops frames without breaking connections, as well as breaking them.
check hold ""
check hold "-DCHAOS"
check hold "-DMAX_BREAKS=3 -DMAX_TIMEOUTS=1"
check hold "-DCHAOS -DCHAOS_DUP"
check hold "-DCHAOS -DLOSS -DMAX_BREAKS=1 -DMAX_TIMEOUTS=1"
check hold "-DCHAOS -DCHAOS_DUP -DLOSS -DMAX_BREAKS=0 -DMAX_TIMEOUTS=1"
check caught "-DMUTANT_DELETE_OVERTAKES_CHILD"
check caught "-DMUTANT_DELETE_OVERTAKES_FORK"
check caught "-DMUTANT_FORK_NOT_IDEMPOTENT"
check caught "-DCHAOS -DLOSS -DMAX_BREAKS=1 -DMAX_TIMEOUTS=1 -DMUTANT_FORGETS_DELETED"
check caught "-DCHAOS -DCHAOS_DUP -DMUTANT_NO_DEDUPE -DMUTANT_FORGETS_DELETED"
exit $fail
