#!/usr/bin/env bash
# make demo: the seed example, worker0 calls add(3, 4) on worker1 and prints 7.
# Runs on the simulator (and, once built, over TCP between two processes).
set -euo pipefail
build=${1:-build}
echo "== simulator: add(3, 4) =="
"$build/examples/add_sim"
if [ -x "$build/examples/add_tcp" ] && [ -x "$build/real/tprun" ]; then
  echo "== TCP, two processes through tprun: add(3, 4) =="
  "$build/real/tprun" --nproc 2 --no-prefix "$build/examples/add_tcp"
fi
