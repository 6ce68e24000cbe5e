#!/usr/bin/env bash
# install_test.sh BUILD_DIR: installs the build into a fresh prefix and
# builds a small program outside the tree against it twice, through
# pkg-config and through CMake's find_package, then runs each with the
# installed tprun: worker 0 calls add(3, 4) on worker 1 (spec/api.md LIB-2).
set -uo pipefail
build=$(cd "${1:?usage: install_test.sh BUILD_DIR}" && pwd)
cc=${CC:-cc}
work=$(cd "$(mktemp -d)" && pwd -P) # the resolved path the installer prints
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail=0
check() { # check NAME EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then echo "FAIL $1: expected [$2], got [$3]"; fail=1; else echo "ok   $1"; fi
}

cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
for f in include/tensorplay/rpc.h lib/libtensorplay-rpc.a lib/libtensorplay-rpc.so \
         lib/pkgconfig/tensorplay-rpc.pc lib/cmake/tensorplay-rpc/tensorplay-rpc-config.cmake \
         bin/tprun bin/tpsim; do
  check "installed $f" yes "$([ -e "$prefix/$f" ] && echo yes || echo no)"
done

mkdir -p "$work/app"
cat >"$work/app/app.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <tensorplay/rpc.h>

static tp_status add(tp_call *call, const tp_value *args, const tp_value *kwargs,
                     tp_value **result, void *user_data) {
    (void)call, (void)kwargs, (void)user_data;
    int64_t a = 0, b = 0;
    tp_value_get_int(tp_list_get(args, 0), &a);
    tp_value_get_int(tp_list_get(args, 1), &b);
    *result = tp_value_int(a + b);
    return TP_OK;
}

int main(void) {
    int rank = atoi(getenv("RANK") ? getenv("RANK") : "-1");
    char name[16];
    snprintf(name, sizeof name, "worker%d", rank);
    if (!tp_is_available() || tp_register_function("add", add, NULL) != TP_OK ||
        tp_init_rpc(name, "TENSORPIPE", rank, 2, NULL) != TP_OK) {
        fprintf(stderr, "init: %s\n", tp_errmsg());
        return 1;
    }
    if (rank == 0) {
        tp_value *args = tp_value_list_of(2, tp_value_int(3), tp_value_int(4)), *r = NULL;
        int64_t x = 0;
        if (tp_rpc_sync(tp_to_name("worker1"), "add", args, NULL, TP_TIMEOUT_DEFAULT, &r) != TP_OK ||
            tp_value_get_int(r, &x) != TP_OK)
            return 1;
        printf("%lld\n", (long long)x);
        tp_value_free(args);
        tp_value_free(r);
    }
    return tp_shutdown(1) == TP_OK ? 0 : 1;
}
C

# Through pkg-config, with nothing but its two flags.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs tensorplay-rpc)
$cc -o "$work/app/app_pc" "$work/app/app.c" $flags >"$work/cc.log" 2>&1 || { cat "$work/cc.log"; fail=1; }
if [ -x "$work/app/app_pc" ]; then
  check "pkg-config app links the shared library" yes \
    "$(grep -q 'libtensorplay-rpc.so.0' <<<"$(readelf -d "$work/app/app_pc")" && echo yes || echo no)"
  out=$(LD_LIBRARY_PATH=$prefix/lib "$prefix/bin/tprun" --nproc 2 --no-prefix "$work/app/app_pc" 2>&1)
  check "pkg-config app runs" 7 "$out"
fi

# Through CMake's package.
cat >"$work/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(app C)
find_package(tensorplay-rpc 0.1 CONFIG REQUIRED)
add_executable(app_cmake app.c)
target_link_libraries(app_cmake PRIVATE tensorplay-rpc::tensorplay-rpc)
CM
if cmake -S "$work/app" -B "$work/app/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
     >"$work/cmake.log" 2>&1 && cmake --build "$work/app/build" >>"$work/cmake.log" 2>&1; then
  out=$("$prefix/bin/tprun" --nproc 2 --no-prefix "$work/app/build/app_cmake" 2>&1)
  check "CMake app runs (rpath to the installed library)" 7 "$out"
else
  cat "$work/cmake.log"
  check "CMake app builds" yes no
fi
# The Python package, when the build made it: installed where the build's
# interpreter looks for this prefix (python/python_install_dir.py) or, for a
# prefix it does not search, with the PYTHONPATH line printed; it imports
# from there and runs the seed example through its launcher.
if [ -d "$build/python/tensorplay" ]; then
  py=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
  py=${py:-${PYTHON:-/usr/bin/python3}}
  src=$(cd "$(dirname "$0")/../.." && pwd)
  site=$("$py" -E -c 'import sysconfig; print(sysconfig.get_path("platlib", "posix_prefix", vars={"base": "'"$prefix"'", "platbase": "'"$prefix"'"}))')
  check "install says where the package went" yes \
    "$(grep -qxF -- "-- tensorplay Python package: $site/tensorplay" "$work/install.log" && echo yes || echo no)"
  check "install prints the PYTHONPATH line (prefix not searched)" yes \
    "$(grep -qxF -- "     export PYTHONPATH=$site" "$work/install.log" && echo yes || echo no)"
  out=$(cd "$work" && PYTHONPATH="$site" "$py" -c \
    'import tensorplay.distributed.rpc as rpc; print(rpc.is_available(), rpc.__file__)' 2>&1)
  check "installed Python package imports" "True $site/tensorplay/distributed/rpc/__init__.py" "$out"
  out=$(cd "$work" && env -u TP_SECRET PYTHONPATH="$site" "$py" -m tensorplay.distributed.run \
    --nproc-per-node 2 "$src/examples/python/seed.py" 2>&1)
  check "installed launcher runs the seed example" "[0] 7" "$out"
  # Debian's python3 searches /usr/local/lib/python3.X/dist-packages: a
  # staged install for that prefix lands there and prints no PYTHONPATH line.
  deb=$("$py" -E "$src/python/python_install_dir.py" /usr/local | tr '\n' ' ')
  if [ "$deb" = "$("$py" -E -c 'import sys; print("/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2])') searched " ]; then
    DESTDIR="$work/stage" cmake --install "$build" --prefix /usr/local >"$work/stage.log" 2>&1
    d=${deb% searched }
    check "Debian prefix /usr/local: package in $d" yes \
      "$([ -f "$work/stage$d/tensorplay/distributed/run.py" ] && ls "$work/stage$d"/tensorplay/_rpc.*.so >/dev/null 2>&1 && echo yes || echo no)"
    check "Debian prefix /usr/local: no PYTHONPATH line" 0 "$(grep -c PYTHONPATH "$work/stage.log")"
  fi
  # TP_PYTHON_INSTALL_DIR overrides, relative to the prefix.
  cmake -DCMAKE_INSTALL_PREFIX="$work/p2" -DTP_PYTHON_INSTALL_DIR=custom/py \
    -P "$build/python/cmake_install.cmake" >"$work/p2.log" 2>&1
  out=$(cd "$work" && PYTHONPATH="$work/p2/custom/py" "$py" -c \
    'import tensorplay.distributed.rpc as rpc; print(rpc.is_available(), rpc.__file__)' 2>&1)
  check "TP_PYTHON_INSTALL_DIR=custom/py imports" "True $work/p2/custom/py/tensorplay/distributed/rpc/__init__.py" "$out"
fi
exit $fail
