#!/usr/bin/env bash
# lib_exports.sh LIB.so: the shared library exports the public tp_ API and
# nothing else (spec/api.md LIB-1), under its soname.
set -uo pipefail
lib=${1:?usage: lib_exports.sh libtensorplay-rpc.so}
fail=0
syms=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
bad=$(printf '%s\n' "$syms" | grep -v -e '^tp_' -e '^TENSORPLAY_RPC_0$' -e '^$' || true)
if [ -n "$bad" ]; then
  echo "FAIL exported symbols outside the tp_ API:"; printf '  %s\n' $bad | head -50; fail=1
else
  echo "ok   $(printf '%s\n' "$syms" | grep -c '^tp_') tp_ symbols, nothing else"
fi
for want in tp_init_rpc tp_rpc_sync tp_shutdown tp_remote tp_future_wait tp_sim_new; do
  # A here-string, not a pipe: grep -q exits at its match, and under pipefail
  # a writer still writing would die of SIGPIPE and fail the check.
  grep -qx "$want" <<<"$syms" || { echo "FAIL $want is not exported"; fail=1; }
done
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libtensorplay-rpc.so.0" ] && echo "ok   soname $soname" || { echo "FAIL soname [$soname]"; fail=1; }
exit $fail
