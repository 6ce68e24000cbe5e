#!/usr/bin/env python3
"""mutate_selftest.py: scripts/mutate.py's C candidates, on lines written
here (spec/sim.md SIM-11): operators are found outside string and character
literals and never inside one, a line that quotes text is mutated like any
other, reports are left alone, and the equivalents file's entries match
the lines they name. Exits non-zero on the first wrong answer."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import mutate  # noqa: E402

failed = 0


def check(what, ok):
    global failed
    if not ok:
        print("FAIL", what)
        failed = 1


# Literal contents masked, positions kept, quotes and code left as they are.
line = '    if (a == 1 && strcmp(x, "a == b") == 0 && c == \'"\' && d < 3) { // e == f'
masked = mutate.mask_literals(line)
check("same length", len(masked) == len(line))
check("string masked", '"xxxxxx"' in masked and "a == b" not in masked)
check("char masked", "'x'" in masked)
check("code kept", masked.startswith("    if (a == 1 && strcmp(x, ") and "d < 3" in masked)
check("comment kept", masked.endswith("// e == f"))
check("escape masked", mutate.mask_literals(r'    s = "x\"==y";') == '    s = "xxxxxx";')

SOURCE = """static int f(const char *name, int n) {
    if (strcmp(name, "a == b") == 0 || n < 3)
        return 1;
    setenv("MODE", "on", 1);
    c->owed -= n; /* paid */
    tpi_log(TP_LOG_WARN, "n == %d", n);
    return 0;
}
"""
cands = mutate.c_candidates("common/selftest.c", SOURCE)
lines = SOURCE.split("\n")
edited = [(m.op, m.edits[0][1]) for m in cands]
check("a comparison on a quoting line is mutated",
      any(op == "eq->ne" and '"a == b") != 0' in t for op, t in edited))
check("the line's other operators too",
      any(op == "or->and" and "&& n < 3" in t for op, t in edited))
check("nothing inside a literal changes",
      all('"a == b"' in t for op, t in edited if "strcmp" in t))
check("a call that quotes text can be deleted",
      any(m.op == "delete" and 'setenv' in lines[m.line] for m in cands))
check("a statement with a comment after it can be deleted",
      any(m.op == "delete" and 'owed -= n' in lines[m.line] for m in cands))
check("a report is left alone", not any("tpi_log" in lines[m.line] for m in cands))

# Every equivalent entry names a line its file still has: a stale entry
# hides nothing and no longer says anything about the mutant it was for.
for (rel, orig, _mutant) in mutate.load_equivalent():
    path = os.path.join(ROOT, rel)
    text = open(path).read() if os.path.exists(path) else ""
    check("%s still has: %s" % (rel, orig),
          any(l.strip() == orig for l in text.split("\n")))

print("mutate_selftest: %s" % ("failed" if failed else "ok"))
sys.exit(failed)
