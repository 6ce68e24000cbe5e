#!/usr/bin/env bash
# Installs the Debian packages the build needs, when they are missing.
# As root it runs apt-get itself; otherwise it prints the exact line and fails.
#
# Usage: scripts/install-deps.sh [--tests] [extra-package...]
#   --tests  also the packages only tests use (TEST_PACKAGES): Debian's
#            PyTorch, which PyTorch's own rpc tests and the torch cases run
#            against, and etcd-server, the etcd the etcd store's tests start
#            on ports of their own (spec/etcd.md ETCD-10; on a machine with
#            systemd, Debian also enables its own etcd.service on
#            127.0.0.1:2379, which the tests do not use). Best effort, one
#            package at a time: when one cannot be installed (not root, no
#            network, no package for this machine) it says so and goes on,
#            and its tests skip. With its variable set to 1 it fails instead,
#            and so do those tests: TP_REQUIRE_TORCH=1 (CI) for python3-torch,
#            TP_REQUIRE_ETCD=1 for etcd-server.
set -euo pipefail
# Each test package with the variable that makes its absence a failure.
TEST_PACKAGES=(python3-torch:TP_REQUIRE_TORCH etcd-server:TP_REQUIRE_ETCD)
tests=0
if [ "${1:-}" = "--tests" ]; then
  tests=1
  shift
fi
# libcurl4-openssl-dev and libjansson-dev: the etcd store's HTTP and JSON (spec/etcd.md).
need=(gcc make cmake pkg-config libsqlite3-dev libuv1-dev libssl-dev libcurl4-openssl-dev libjansson-dev libcmocka-dev valgrind python3 python3-dev python3-pytest python3-numpy python3-venv spin "$@")

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
status=0
for entry in "${TEST_PACKAGES[@]}"; do
  pkg=${entry%%:*}
  var=${entry#*:}
  mapfile -t missing < <(missing_of "$pkg")
  install "${missing[@]}" && continue
  if [ "${!var:-0}" = 1 ]; then
    echo "install-deps: $var=1 and $pkg could not be installed" >&2
    status=1
  else
    echo "install-deps: going on without $pkg: its tests will be skipped" >&2
  fi
done
exit $status
