#!/usr/bin/env bash
# make bench: prints the benchmark figures, "BENCH <name> <value> <unit>", on
# stdout (progress and notes go to stderr). bench/README.md explains them.
#
# Usage: scripts/bench.sh BUILD_DIR [--no-pytorch | --pytorch] [--quick]
#                         [--placement spread|one|free]
#   (default)     tensorplay-rpc (BUILD_DIR/bench/rpc_bench), then the same
#                 workloads on PyTorch RPC when python3 can import torch
#   --no-pytorch  tensorplay-rpc only
#   --pytorch     PyTorch only; installs Debian's python3-torch when it is
#                 missing and we are root, else prints the apt-get line and fails
#   --quick       fewer samples: a smoke run of everything
#   --placement   where the two worker processes run (rpc_bench --help)
# Exits non-zero when a workload fails to run, never for a missed target.
# PYTHON overrides the interpreter for PyTorch (default: Debian's /usr/bin/python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build}"
[ $# -gt 0 ] && shift
mode=both
common=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-pytorch) mode=ours ;;
    --pytorch) mode=pytorch ;;
    --quick) common+=(--quick) ;;
    --placement) common+=(--placement "${2:?--placement needs spread, one or free}"); shift ;;
    *) echo "bench.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done

bin="$build/bench/rpc_bench"
for b in "$bin" "$build/bench/flood_bench"; do
  if [ ! -x "$b" ]; then
    echo "bench.sh: $b is missing: build first (make bench builds it)" >&2
    exit 1
  fi
done
python="${PYTHON:-/usr/bin/python3}"
figures="$(mktemp)"
trap 'rm -f "$figures"' EXIT

have_torch() { "$python" -c 'import torch.distributed.rpc' >/dev/null 2>&1; }

echo "# bench $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) CPUs, $(uname -r)" >&2

# syscalls_per_rpc_sync counts with strace.
"$here/scripts/install-deps.sh" strace

if [ "$mode" != pytorch ]; then
  echo "# tensorplay-rpc: $bin ${common[*]}" >&2
  "$bin" "${common[@]}"
  # The simulator's own speed (spec/sim.md SIM-10): CPU-time figures.
  quick=()
  for a in "${common[@]}"; do [ "$a" = --quick ] && quick=(--quick); done
  echo "# the simulator: $build/bench/sim_bench ${quick[*]}" >&2
  "$build/bench/sim_bench" "${quick[@]}"
  # The sweep's instructions, which the machine's load does not move: one
  # warm world of n workers is half of what 3 worlds take beyond 1 (so the
  # process's start and the first world's page faults cancel out).
  if [ ${#quick[@]} -eq 0 ] && command -v valgrind >/dev/null; then
    echo "# the simulator's instructions per world: valgrind --tool=cachegrind" >&2
    irefs() {
      valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        "$build/bench/sim_bench" --workers "$1" --reps "$2" 2>&1 >/dev/null |
        awk '/I *refs:/ { gsub(",", "", $NF); print $NF }'
    }
    for n in 125 1000; do
      one="$(irefs "$n" 1)" three="$(irefs "$n" 3)"
      echo "BENCH sim_seed_${n}_workers_minstr $(awk -v a="$one" -v b="$three" \
        'BEGIN { printf "%.1f", (b - a) / 2e6 }') Minstr"
    done | tee "$figures"
    awk '$2 == "sim_seed_125_workers_minstr" { a = $3 } $2 == "sim_seed_1000_workers_minstr" { b = $3 }
         END { if (a > 0 && b > 0) printf "BENCH sim_worker_scaling_exponent_instructions_125_to_1000 %.2f power\n", log(b / a) / log(8) }' \
      "$figures"
  fi
  # Issue 21 item 5: a legitimate caller's latency while and after another
  # member floods the same callee (3 ranks; bench/README.md "Flood").
  echo "# the flood: $build/bench/flood_bench ${quick[*]}" >&2
  "$build/bench/flood_bench" "${quick[@]}"
  # The same workloads from Python over the same library (issue 10).
  if [ -d "$build/python/tensorplay" ]; then
    echo "# Python: bench/python_rpc_bench.py ${quick[*]}" >&2
    PYTHONPATH="$build/python" "$python" "$here/bench/python_rpc_bench.py" "${quick[@]}" \
      | tee "$figures"
  fi
fi

if [ "$mode" = both ] && ! have_torch; then
  echo "# PyTorch RPC skipped: '$python' cannot import torch (scripts/bench.sh $build" \
       "--pytorch installs Debian's python3-torch as root)" >&2
  exit 0
fi
if [ "$mode" = ours ]; then
  exit 0
fi
if ! have_torch; then
  line="apt-get update && apt-get install -y --no-install-recommends python3-torch"
  if [ "$(id -u)" -ne 0 ]; then
    echo "bench.sh: PyTorch is missing; run as root:  $line" >&2
    exit 1
  fi
  echo "# installing python3-torch (Debian's PyTorch 1.13)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends python3-torch >&2
  have_torch || { echo "bench.sh: '$python' still cannot import torch" >&2; exit 1; }
fi

echo "# PyTorch $("$python" -c 'import torch; print(torch.__version__)') RPC:" \
     "TensorPipe, _transports=[uv] _channels=[basic]" >&2
GLOG_minloglevel=2 "$python" "$here/bench/pytorch_rpc_bench.py" "${common[@]}" | tee -a "$figures"
# Issue 20's figure, as a ratio of two measurements of this one run: how many
# times faster a 64 MiB torch tensor's round trip is here than on PyTorch.
awk '$2 == "python_torch_echo_64MiB_ms" { ours = $3 } $2 == "pytorch_torch_echo_64MiB_ms" { theirs = $3 }
     END { if (ours > 0 && theirs > 0) printf "BENCH ratio_torch_echo_64MiB_vs_pytorch %.2f x\n", theirs / ours }' \
  "$figures"
