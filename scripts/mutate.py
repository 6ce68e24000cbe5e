#!/usr/bin/env python3
"""mutate.py: mutation testing of common/ (make mutate; spec/sim.md SIM-11).

Copies the tree to a scratch folder, then for each mutant: applies one small
semantic change to one line of common/ (a flipped comparison, a swapped
logical operator, an off-by-one, a deleted statement, a wrong status), builds
the library and the tests that exercise it (with LeakSanitizer), and runs
them. A mutant is killed when a test fails, crashes, hangs or leaks; it
survives when every test passes. Mutants that do not compile are not counted. The score is
killed / (killed + survived).

Mutants are drawn deterministically from --seed among every candidate line,
so two runs with the same seed and tree test the same mutants.

Usage: scripts/mutate.py [--count N] [--seed S] [--jobs J] [--keep DIR]
                         [--files common/call.c,...] [--list]
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The semantic core: where a wrong line changes what a user sees.
DEFAULT_FILES = [
    "common/call.c", "common/future.c", "common/serve.c", "common/shutdown.c",
    "common/rendezvous.c", "common/lifecycle.c", "common/rref.c", "common/core.c",
    "common/method.c", "common/rejoin.c",
]

# Each operator: (name, regex, replacement). Applied to one match on one line.
OPERATORS = [
    ("lt->le", r"(?<![<>=!])<(?![<=])", "<="),
    ("le->lt", r"<=", "<"),
    ("gt->ge", r"(?<![<>=!-])>(?![>=])", ">="),
    ("ge->gt", r">=", ">"),
    ("eq->ne", r"==", "!="),
    ("ne->eq", r"!=", "=="),
    ("and->or", r"&&", "||"),
    ("or->and", r"\|\|", "&&"),
    ("inc->dec", r"\+\+", "--"),
    ("dec->inc", r"--", "++"),
    ("plus1->plus0", r"\+ 1\b", "+ 0"),
    ("ok->eio", r"\breturn TP_OK;", "return TP_EIO;"),
    ("not-dropped", r"if \(!", "if ("),
]

# Lines whose deletion is a plausible bug: a statement that calls, assigns or counts.
DELETABLE = re.compile(r"^\s+(?:[a-z_]+\([^;]*\);|[a-z_>\-\.\[\]]+\s*(?:=|\+=|-=)[^=][^;]*;|"
                       r"[a-z_>\-\.\[\]]+(?:\+\+|--);)\s*$")

SKIP = re.compile(r"^\s*(?:/?\*|//|#|TPI_ASSERT|assert|tpi_format|tpi_fail|return tpi_fail|"
                  r"char |static |typedef |case |default:)")


def candidates(files):
    out = []
    for rel in files:
        with open(os.path.join(ROOT, rel)) as f:
            lines = f.read().split("\n")
        in_comment = False
        for i, line in enumerate(lines):
            s = line.strip()
            if in_comment:
                if "*/" in s:
                    in_comment = False
                continue
            if s.startswith("/*") and "*/" not in s:
                in_comment = True
                continue
            if not s or SKIP.match(line) or '"' in line:
                continue
            for name, pat, rep in OPERATORS:
                for m in re.finditer(pat, line):
                    out.append((rel, i, name, m.start(), m.end(), rep))
            prev = lines[i - 1].rstrip() if i else ""
            starts_statement = prev.endswith((";", "{", "}", "else")) or \
                re.match(r"\s*(?:\} else )?(?:if|for|while) \(.*\)$", prev)
            if DELETABLE.match(line) and starts_statement:
                out.append((rel, i, "delete", 0, len(line), ";  /* deleted */"))
    return out


def apply(tree, mutant):
    rel, i, name, a, b, rep = mutant
    path = os.path.join(tree, rel)
    with open(path) as f:
        lines = f.read().split("\n")
    orig = lines[i]
    lines[i] = orig[:a] + rep + orig[b:]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return orig, lines[i]


def restore(tree, rel, pristine):
    # From the copy taken at the start: the working tree may have moved on.
    with open(os.path.join(tree, rel), "w") as f:
        f.write(pristine[rel])


TARGETS = ["tpsim", "conformance_sim", "test_future", "test_timeout",
           "test_shutdown", "test_init", "test_send_failure", "test_rejoin"]


def tests(build):
    t = os.path.join(build, "tests")
    tp = os.path.join(build, "tools", "tpsim")
    return [
        ("conformance_sim", [os.path.join(t, "conformance", "conformance_sim")]),
        ("test_future", [os.path.join(t, "test_future")]),
        ("test_timeout", [os.path.join(t, "test_timeout")]),
        ("test_shutdown", [os.path.join(t, "test_shutdown")]),
        ("test_init", [os.path.join(t, "test_init")]),
        ("test_send_failure", [os.path.join(t, "test_send_failure")]),
        ("test_rejoin", [os.path.join(t, "test_rejoin")]),
        ("swarm", [tp, "swarm", "--seeds", "1..150"]),
        ("swarm16", [tp, "swarm", "--seeds", "1001..1010", "--workers", "16"]),
        ("scenarios", ["sh", "-c", " && ".join(
            f"{tp} --scenario {s} --workers 5 --seed 3 >/dev/null"
            for s in ["fanout", "nested", "remote", "shutdown_load", "worker_death"])]),
    ]


# LeakSanitizer alone (-fsanitize=leak) has no fiber API: a malloc made on a
# simulator task's stack (sim/sim_task.c) unwinds no further than its own
# frame, and LSan treats a chunk with no caller PC as reachable ("may be
# allocated in a coroutine"), with everything it points to. Every worker core
# is allocated on such a stack, so without the slow (DWARF) unwinder no leak
# of the core would ever be reported. ASan builds (TP_SANITIZE) tell the
# sanitizer about each switch and do not need this. Reports go to /dev/null:
# unsymbolized, a leaking mutant's conformance run ends well inside --timeout.
LSAN_ENV = dict(os.environ, LSAN_OPTIONS=":".join(
    o for o in (os.environ.get("LSAN_OPTIONS", ""), "fast_unwind_on_malloc=0:symbolize=0") if o))


def run_tests(build, timeout_s):
    for name, cmd in tests(build):
        try:
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=timeout_s, env=LSAN_ENV)
        except subprocess.TimeoutExpired:
            return name + " (hung)"
        if r.returncode != 0:
            return name + (f" (signal {-r.returncode})" if r.returncode < 0 else "")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--files", default=",".join(DEFAULT_FILES))
    ap.add_argument("--keep", help="scratch folder to use and keep")
    ap.add_argument("--timeout", type=int, default=20, help="seconds per test (a hang kills)")
    ap.add_argument("--list", action="store_true", help="list the drawn mutants only")
    args = ap.parse_args()

    files = [f for f in args.files.split(",") if f]
    pool = candidates(files)
    rng = random.Random(args.seed)
    chosen = rng.sample(pool, min(args.count, len(pool)))
    chosen.sort()
    print(f"mutate: {len(pool)} candidate mutants in {len(files)} files; "
          f"testing {len(chosen)} (seed {args.seed})", flush=True)
    if args.list:
        for m in chosen:
            print(f"  {m[0]}:{m[1] + 1} {m[2]}")
        return 0

    tree = args.keep or tempfile.mkdtemp(prefix="tp-mutate.")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(ROOT, tree, symlinks=True,
                    ignore=shutil.ignore_patterns("build*", ".git"))
    pristine = {}
    for rel in files:
        with open(os.path.join(tree, rel)) as f:
            pristine[rel] = f.read()
    build = os.path.join(tree, "build-mutate")
    # A deleted assignment can leave a variable unused: with -Werror that
    # mutant would not compile and would not count, so the scratch tree
    # builds with warnings as warnings.
    cml = os.path.join(tree, "CMakeLists.txt")
    with open(cml) as f:
        text = f.read()
    with open(cml, "w") as f:
        f.write(text.replace("-Wall -Wextra -Werror", "-Wall -Wextra"))
    # LeakSanitizer (cheap, unlike ASan): a mutant that leaks is killed too.
    subprocess.run(["cmake", "-S", tree, "-B", build, "-DTP_BUILD_FUZZ=OFF",
                    "-DCMAKE_C_FLAGS=-fsanitize=leak", "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=leak"],
                   check=True, stdout=subprocess.DEVNULL)

    def make():
        return subprocess.run(["cmake", "--build", build, "-j", str(args.jobs), "--target"]
                              + TARGETS, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0

    if not make() or run_tests(build, args.timeout):
        print("mutate: the unmutated tree does not build or pass; nothing to measure")
        return 2
    killed, survived, invalid = [], [], 0
    t0 = time.time()
    for n, m in enumerate(chosen, 1):
        rel, i = m[0], m[1]
        orig, new = apply(tree, m)
        where = f"{rel}:{i + 1} {m[2]}"
        if not make():
            invalid += 1
            verdict = "does not compile"
        else:
            by = run_tests(build, args.timeout)
            if by:
                killed.append((where, by))
                verdict = f"killed by {by}"
            else:
                survived.append((where, orig.strip(), new.strip()))
                verdict = "SURVIVED"
        restore(tree, rel, pristine)
        print(f"[{n}/{len(chosen)}] {where}: {verdict}", flush=True)
    make()
    total = len(killed) + len(survived)
    score = 100.0 * len(killed) / total if total else 0.0
    print(f"\nmutate: {len(killed)} killed, {len(survived)} survived, {invalid} did not compile; "
          f"score {score:.1f}% ({time.time() - t0:.0f} s)")
    for where, orig, new in survived:
        print(f"  survived {where}\n    - {orig}\n    + {new}")
    if not args.keep:
        shutil.rmtree(tree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
