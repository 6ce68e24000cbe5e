#!/usr/bin/env bash
# spin_rref.sh MODEL: checks the rref protocol's Promela model (spec/rref.pml,
# issue 9 item 5) with spin: both claims must hold on the model as written,
# with and without CHAOS (frames of one link taken in any order), and each
# deliberately broken variant must be caught, so a pass is evidence.
set -uo pipefail
model=${1:?usage: spin_rref.sh spec/rref.pml}
command -v spin >/dev/null || { echo "spin_rref: spin not found (Debian package spin)" >&2; exit 1; }
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$model" "$work/rref.pml"
cd "$work" || exit 1
fail=0

# errors CONFIG CLAIM: prints the error count of one verification run.
errors() {
  rm -f pan pan.* ./*.trail
  spin $1 -a rref.pml >spin.log 2>&1 || { cat spin.log >&2; echo "spin_rref: spin -a $1 failed" >&2; echo X; return; }
  $cc -O2 -w -DVECTORSZ=2048 -o pan pan.c >cc.log 2>&1 || { cat cc.log >&2; echo X; return; }
  ./pan -a -f -m100000 -N "$2" >pan.log 2>&1
  local e
  e=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.log | head -1)
  if grep -q "search depth too small\|max search depth too small" pan.log; then e=X; fi
  echo "${e:-X}"
}

check() { # check WANT(hold|caught) CONFIG...
  local want=$1 cfg=$2 total=0 bad=0 n
  for claim in once_each eventually_freed; do
    n=$(errors "$cfg" "$claim")
    [ "$n" = X ] && bad=1 && continue
    total=$((total + n))
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

check hold ""
check hold "-DCHAOS"
check hold "-DMAX_BREAKS=3 -DMAX_TIMEOUTS=2"
check caught "-DMUTANT_DELETE_OVERTAKES_CHILD"
check caught "-DMUTANT_DELETE_OVERTAKES_FORK"
check caught "-DMUTANT_FORK_NOT_IDEMPOTENT"
check caught "-DCHAOS -DCHAOS_DUP"
exit $fail
