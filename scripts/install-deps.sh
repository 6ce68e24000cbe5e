#!/usr/bin/env bash
# Installs the Debian packages the build needs, when they are missing.
# As root it runs apt-get itself; otherwise it prints the exact line and fails.
#
# Usage: scripts/install-deps.sh [--tests] [extra-package...]
#   --tests  also the packages only tests use (TEST_PACKAGES: Debian's
#            PyTorch, which PyTorch's own rpc tests and the torch cases run
#            against). Best effort: when they cannot be installed (not root,
#            no network, no package for this machine) it says so and goes
#            on, and those tests skip. With TP_REQUIRE_TORCH=1 (CI) it fails
#            instead, and so do those tests.
set -euo pipefail
TEST_PACKAGES=(python3-torch)
tests=0
if [ "${1:-}" = "--tests" ]; then
  tests=1
  shift
fi
need=(gcc make cmake pkg-config libsqlite3-dev libuv1-dev libssl-dev libcmocka-dev valgrind python3 python3-dev python3-pytest python3-numpy python3-venv spin "$@")

missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

# Installs the packages given; 0, or 1 with the reason on stderr.
install() {
  [ $# -eq 0 ] && return 0
  local line="apt-get update && apt-get install -y --no-install-recommends $*"
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: $*" >&2
    echo "run as root:  $line" >&2
    return 1
  fi
  echo "installing: $*" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "$@" >&2
}

mapfile -t missing < <(missing_of "${need[@]}")
install "${missing[@]}" || exit 1
[ "$tests" -eq 1 ] || exit 0
mapfile -t missing < <(missing_of "${TEST_PACKAGES[@]}")
if ! install "${missing[@]}"; then
  if [ "${TP_REQUIRE_TORCH:-0}" = 1 ]; then
    echo "install-deps: TP_REQUIRE_TORCH=1 and ${missing[*]} could not be installed" >&2
    exit 1
  fi
  echo "install-deps: going on without ${missing[*]}: the torch tests will be skipped" >&2
fi
