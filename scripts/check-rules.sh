#!/usr/bin/env bash
# Determinism rule (spec/agent.md AGENT-1): common/ and sim/ take time,
# randomness, threads, libuv and SQLite only through the agent interface.
# Fails listing each offending line. Comments are skipped.
# Usage: scripts/check-rules.sh [ROOT]   (ROOT defaults to the repository)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
pattern='\b(time|clock|clock_gettime|gettimeofday|rand|random|srand|rand_r|drand48|getenv|pthread_[a-z_]+|thrd_[a-z_]+|mtx_[a-z_]+|cnd_[a-z_]+|uv_[a-z_]+|sqlite3_[a-z_0-9]+|sleep|usleep|nanosleep|fork)\s*\('
# Two exceptions: common/log.c reads TP_LOG, which changes what is written to
# stderr, never what the core does (spec/api.md LOG-1); common/lifecycle.c
# reads TP_REJOIN for the process's own worker only, never a simulated one
# (tp_context_new's slots), so a simulated world still depends on its seed
# alone (spec/lifecycle.md REJOIN-1).
hits=$(grep -rnE "$pattern" common sim --include='*.c' --include='*.h' \
        | grep -vE '^[^:]+:[0-9]+:\s*(//|/?\*)' \
        | grep -vE '^common/log\.c:[0-9]+:.*\bgetenv\("TP_LOG"\)' \
        | grep -vE '^common/lifecycle\.c:[0-9]+:.*\bgetenv\("TP_REJOIN"\)' || true)
includes=$(grep -rnE '#\s*include\s*<(pthread|threads|uv|sqlite3|time|sys/time)\.h>' common sim \
        --include='*.c' --include='*.h' || true)
if [ -n "$hits$includes" ]; then
  echo "check-rules: forbidden calls or headers in common/ or sim/ (route them through the agent):"
  [ -n "$hits" ] && echo "$hits"
  [ -n "$includes" ] && echo "$includes"
  exit 1
fi
echo "check-rules: common/ and sim/ are free of direct time, randomness, thread, libuv and SQLite calls"
