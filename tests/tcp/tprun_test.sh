#!/usr/bin/env bash
# tprun_test.sh TPRUN [ADD_TCP]: the launcher's contract (spec/tcp.md TCP-13),
# and, when given, the seed example through it over TCP.
set -uo pipefail
tprun=$1
add_tcp=${2:-}
fail=0
check() { # check NAME EXPECTED ACTUAL
  if [ "$2" != "$3" ]; then echo "FAIL $1: expected [$2], got [$3]"; fail=1; else echo "ok   $1"; fi
}

# Environment and prefixes: every rank, every line, stdout and stderr apart.
out=$("$tprun" --nproc 3 --master-port 29999 sh -c \
  'echo "$RANK/$WORLD_SIZE $MASTER_ADDR:$MASTER_PORT"; echo "e$RANK" >&2; printf tail' 2>/tmp/tprun_err.$$)
rc=$?
check "exit 0" 0 "$rc"
check "stdout lines" "[0] 0/3 127.0.0.1:29999
[0] tail
[1] 1/3 127.0.0.1:29999
[1] tail
[2] 2/3 127.0.0.1:29999
[2] tail" "$(echo "$out" | sort)"
check "stderr lines" "[0] e0
[1] e1
[2] e2" "$(sort /tmp/tprun_err.$$)"
rm -f /tmp/tprun_err.$$

# A free port is chosen when none is given.
port=$("$tprun" --nproc 1 sh -c 'echo $MASTER_PORT' | sed 's/^\[0\] //')
case "$port" in ''|*[!0-9]*) check "free port" "a number" "$port" ;; *) check "free port" ok ok ;; esac

# One failure stops the others (they would sleep 30 s) and gives its status.
start=$(date +%s)
"$tprun" --nproc 3 --grace 1 sh -c 'if [ $RANK = 2 ]; then exit 7; fi; exec sleep 30' >/dev/null 2>&1
rc=$?
took=$(( $(date +%s) - start ))
check "failure status" 7 "$rc"
check "others stopped fast" yes "$([ "$took" -lt 10 ] && echo yes || echo "no ($took s)")"

# A process that ignores SIGTERM is killed after the grace period.
start=$(date +%s)
"$tprun" --nproc 2 --grace 1 sh -c 'if [ $RANK = 0 ]; then sleep 0.2; kill -9 $$; fi; trap "" TERM; while :; do sleep 0.1; done' >/dev/null 2>&1
rc=$?
took=$(( $(date +%s) - start ))
check "signal status" 137 "$rc"
check "grace then SIGKILL" yes "$([ "$took" -lt 10 ] && echo yes || echo "no ($took s)")"

# A rank's program gets the descriptors tprun was given, its own pipes as
# stdout and stderr, and no other end of them: a stray copy (say, kept by
# something it starts in the background with its output sent elsewhere)
# would hold tprun's end open past the program's exit.
fds() { sort -n | tr '\n' ' '; }
base=$(ls /proc/self/fd | fds)
out=$("$tprun" --nproc 2 ls /proc/self/fd)
check "rank 0 descriptors" "$base" "$(echo "$out" | sed -n 's/^\[0\] //p' | fds)"
check "rank 1 descriptors" "$base" "$(echo "$out" | sed -n 's/^\[1\] //p' | fds)"

# Usage errors.
# --no-prefix: the lines as the program wrote them.
out=$("$tprun" --nproc 1 --no-prefix sh -c 'echo "rank $RANK"')
check "no prefix" "rank 0" "$out"

"$tprun" sh -c true >/dev/null 2>&1; check "no --nproc" 2 $?
"$tprun" --nproc 0 sh -c true >/dev/null 2>&1; check "bad --nproc" 2 $?
"$tprun" --nproc 1 /nonexistent/program >/dev/null 2>&1; check "missing program" 127 $?

if [ -n "$add_tcp" ]; then
  out=$("$tprun" --nproc 2 "$add_tcp" 2>&1)
  check "add_tcp over TCP" "[0] 7" "$out"
fi
[ $fail = 0 ] && echo "tprun_test: all passed"
exit $fail
