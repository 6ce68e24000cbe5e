#!/usr/bin/env python3
"""coverage.py: which lines of the C code make test never runs (make coverage).

A mutant on a line no test executes survives whatever it does, so the lines
the suite never reaches are where scripts/mutate.py's survivors come from
first. This builds the tree with gcc's --coverage in its own folder
(build-cov), runs make test's tests there (ctest), and reads the counts with
gcov. It prints, per file of mutate.py's folders (common, real, and
python/_rpc.c): its executable lines, how many ran, and how many of
mutate.py's candidate mutants lie on lines that never ran (each a certain
survivor); then, per folder, the share of candidates on lines that ran, the
ceiling of a mutation score drawn there.

Usage: scripts/coverage.py [--build DIR] [--no-run] [--jobs J] [--tests REGEX]
                           [--show FILE[,FILE...]]
  --no-run  read the counts the last run left (no configure, build or tests)
  --tests   only the ctest tests matching REGEX (ctest -R)
  --show    also list the never-run line ranges of these files (with the
            count of candidates on each)

Counts are summed over every process a test starts (forked workers write
theirs at exit; one killed by SIGKILL writes none, nor does a child between
its fork and its exec, as in tprun's spawn), so a line run only by such a
process shows as never run. It is a guide to where tests
are missing, not a verdict: a line that ran may still be untested (no test
checks what it did), which only mutate.py tells.
"""
import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import mutate  # noqa: E402  (its folders, files and candidates)

FLAGS = "--coverage -O0"


def run(cmd, **kw):
    print("coverage: " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, **kw)


def build_and_test(build, jobs, tests):
    r = run(["cmake", "-S", ROOT, "-B", build, "-DTP_BUILD_FUZZ=OFF", "-DCMAKE_BUILD_TYPE=Debug",
             "-DCMAKE_C_FLAGS=" + FLAGS, "-DCMAKE_EXE_LINKER_FLAGS=--coverage",
             "-DCMAKE_SHARED_LINKER_FLAGS=--coverage", "-DCMAKE_MODULE_LINKER_FLAGS=--coverage"],
            stdout=subprocess.DEVNULL)
    if r.returncode != 0 or run(["cmake", "--build", build, "-j", str(jobs)],
                                stdout=subprocess.DEVNULL).returncode != 0:
        raise SystemExit("coverage: the build failed")
    for d, _, names in os.walk(build):
        for n in names:
            if n.endswith(".gcda"):
                os.unlink(os.path.join(d, n))
    cmd = ["ctest", "-j", str(2 * jobs), "--timeout", "900"]
    if tests:
        cmd += ["-R", tests]
    r = run(cmd, cwd=build, stdout=subprocess.DEVNULL)
    if r.returncode != 0:  # the counts are still worth reading: say which, go on
        failed = os.path.join(build, "Testing", "Temporary", "LastTestsFailed.log")
        names = open(failed).read().split() if os.path.exists(failed) else []
        print("coverage: tests that failed in the coverage build (counted as far as they "
              "ran; sim_experiment_external links the installed library without --coverage "
              "and cannot pass here): " + " ".join(names), file=sys.stderr)


def read_counts(build):
    """{rel source: {line (1-based): count}}, summed over every object built from it."""
    counts = defaultdict(lambda: defaultdict(int))
    gcdas = sorted(os.path.join(d, n) for d, _, names in os.walk(build) for n in names
                   if n.endswith(".gcda"))
    if not gcdas:
        raise SystemExit(f"coverage: no .gcda files under {build}: run without --no-run first")
    for g in gcdas:
        r = subprocess.run(["gcov", "--json-format", "--stdout", "-o", os.path.dirname(g), g],
                           cwd=os.path.dirname(g), capture_output=True, text=True)
        if r.returncode != 0:
            continue
        for doc in r.stdout.splitlines():
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc).get("files", []):
                path = os.path.normpath(os.path.join(os.path.dirname(g), f["file"]))
                rel = os.path.relpath(path, ROOT)
                if rel.startswith(".."):
                    continue
                for ln in f.get("lines", []):
                    counts[rel][ln["line_number"]] += ln["count"]
    return counts


def ranges(lines):
    out, start, prev = [], None, None
    for n in sorted(lines):
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append((start, prev))
            start = prev = n
    if start is not None:
        out.append((start, prev))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-cov"))
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tests", default=None)
    ap.add_argument("--show", default="")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    if not args.no_run:
        build_and_test(build, args.jobs, args.tests)
    counts = read_counts(build)
    show = [s for s in args.show.split(",") if s]
    print(f"{'file':32} {'lines':>6} {'ran':>6} {'%':>6} {'candidates':>10} {'on lines never run':>19}")
    for folder in mutate.FOLDERS:
        files = [f for f in mutate.default_files(folder) if f.endswith(".c")]
        cand_all = cand_dead = 0
        for rel in files:
            c = counts.get(rel, {})
            ran = sum(1 for v in c.values() if v > 0)
            cands = mutate.candidates([rel])
            dead = [m for m in cands if c.get(m.line + 1) == 0]
            cand_all += len(cands)
            cand_dead += len(dead)
            pct = 100.0 * ran / len(c) if c else 0.0
            print(f"{rel:32} {len(c):6} {ran:6} {pct:5.1f}% {len(cands):10} {len(dead):19}")
            if rel in show:
                by_line = defaultdict(int)
                for m in dead:
                    by_line[m.line + 1] += 1
                for a, b in ranges(n for n, v in c.items() if v == 0):
                    k = sum(by_line[n] for n in range(a, b + 1))
                    print(f"    never run: {a}-{b}" + (f" ({k} candidates)" if k else ""))
        if cand_all:
            print(f"{folder}: {cand_dead} of {cand_all} candidates on lines never run; "
                  f"a draw's ceiling {100.0 * (cand_all - cand_dead) / cand_all:.1f}%")
    for rel in show:
        if rel not in counts:
            print(f"coverage: no counts for {rel}", file=sys.stderr)


if __name__ == "__main__":
    main()
