#!/usr/bin/env python3
"""mutate.py: mutation testing of common/, real/ and python/ (make mutate; spec/sim.md SIM-11).

Copies the tree to a scratch folder, then for each mutant: applies one small
semantic change to one statement (a flipped comparison, a swapped logical
operator, an off-by-one, a deleted statement, a wrong status; a timeout's unit
or rounding, a MAC's byte range, a deadline or timer never armed; in Python
also `not` dropped, True/False swapped, `return X` made `return None`),
builds what the tests of that file need and runs them, cheapest first. A
mutant is killed when a test fails, crashes, hangs (runs past its limit) or
leaks; it survives when every test passes. Mutants that do not compile are
not counted. The score, per folder and overall, is killed / (killed + survived).
A survivor listed in scripts/mutate_equivalent.txt (a mutant shown, with its
reason, to change nothing a user can see) counts as equivalent, not survived;
a listed mutant that a test kills is reported, since its reason was wrong.

Folders: common (the core; the sim tests, and LeakSanitizer), real (the TCP
transport; the TCP tests, also under LeakSanitizer), python (the package and
its C extension python/_rpc.c; the Python tests, on a plain build since the
interpreter does not carry the sanitizer runtime). A C mutant that survives
runs its tests again in an AddressSanitizer + UndefinedBehaviorSanitizer
build, as `make test` does (SANITIZE=1): an out-of-bounds byte or an overflow
that changes nothing else visible is still a bug that suite catches. A kill
there is checked on the unmutated tree in the same build (else: flaky).

Mutants are drawn deterministically from --seed, --count of them from each
folder's candidates (a folder's draw does not depend on the other folders),
so two runs with the same seed and tree test the same mutants.

Usage: scripts/mutate.py [--count N] [--seed S] [--jobs J] [--keep DIR]
                         [--folders common,real,python] [--files common/call.c,...]
                         [--timeout S] [--mutant-timeout S] [--recheck] [--json FILE] [--list]
                         [--at FILE:LINE[:OP],...]

--at tests the mutants at those lines (of that operator) instead of a draw:
the way to see whether a new test kills a survivor an earlier run reported.
"""
import argparse
import ast
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from collections import Counter, namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"  # Debian's: the one with torch and pytest (python/CMakeLists.txt)
FOLDERS = ("common", "real", "python")

# The semantic code, where a wrong line changes what a user sees. Left out:
# common/ helpers that only format text or that every test trips over at once
# (log.c, errors.c, options.c, idmap.c, blocks.c, context.c, registry.c,
# store_retry.c, backend_registry.c, canary.c) and real/uv_errors.c (a table
# of codes). real/tprun.c is in: its two tests take about 2 s.
DEFAULT_FILES = {
    "common": [
        "common/call.c", "common/future.c", "common/serve.c", "common/shutdown.c",
        "common/rendezvous.c", "common/lifecycle.c", "common/rref.c", "common/core.c",
        "common/method.c", "common/rejoin.c", "common/codec.c", "common/value.c",
        "common/frame.c",
    ],
    "real": [
        "real/tcp_addr.c", "real/tcp_agent.c", "real/tcp_auth.c", "real/tcp_conn.c",
        "real/tcp_crypt.c", "real/tcp_loop.c", "real/tcp_pool.c", "real/tcp_records.c",
        "real/tcp_shm.c", "real/tcp_sock.c", "real/tcp_store.c", "real/tcp_store_server.c",
        "real/tcp_store_wire.c", "real/tcp_sync.c", "real/tprun.c", "real/shm_ring.c",
    ],
    "python": None,  # every python/tensorplay/**/*.py, and python/_rpc.c: see default_files()
}


def default_files(folder):
    if DEFAULT_FILES[folder] is not None:
        return list(DEFAULT_FILES[folder])
    out = []
    for d, subdirs, names in os.walk(os.path.join(ROOT, "python", "tensorplay")):
        subdirs[:] = sorted(s for s in subdirs if s != "__pycache__")
        out += [os.path.relpath(os.path.join(d, n), ROOT) for n in sorted(names) if n.endswith(".py")]
    return sorted(out) + ["python/_rpc.c"]


def folder_of(rel):
    return rel.split("/", 1)[0]


# A mutant: one operator on one statement. edits: ((line index, new text), ...),
# the first on the statement's first line (line); more when a deleted
# statement spans lines.
Mutant = namedtuple("Mutant", "rel line op edits")

# ---------------------------------------------------------------- C operators

# Each operator: (name, regex, replacement, line condition or None). One match
# on one line is one mutant; the replacement is a string or a function of the match.
TIME_WORDS = re.compile(r"(?i)time|deadline|now|second|linger|grace|backoff|delay|sleep|poll|due|"
                        r"tv_n?sec|wait|(?<![a-z])(?:ns|ms|us)(?![a-z])")
# Lines of real/ about MACs: the authentication proofs (TCP-17) and the sealed
# records' tags (TCP-21); also any constant-time compare.
MAC_WORDS = re.compile(r"(?i)(?<![a-z])(?:mac|tag|proof|auth|seal|nonce|hmac|digest|iv)(?![a-z])|"
                       r"CRYPTO_memcmp|sodium_memcmp")
MAC_FILES = re.compile(r"real/")

# A timeout's unit: the factor between units off by 1000 (ns taken for us, ms for s...).
UNIT_SWAP = {"1000000000": "1000000", "1000000": "1000", "1000": "1000000", "1e9": "1e6",
             "1e6": "1e9", "1e3": "1e6", "1000.0": "1000000.0", "1000000.0": "1000.0"}
UNIT_RE = r"(?<![\w.])(1000000000|1000000\.0|1000000|1000\.0|1000|1e9|1e6|1e3)(?=[uUlL]*\b|[^\w.]|$)"


def _unit(m):
    return UNIT_SWAP[m.group(1)]


# A size in a MAC's byte range: a constant named *_SIZE/_TAG/_HEAD/_LEN/_BYTES or a sizeof.
MAC_SIZE_RE = r"\b(?!EVP_)[A-Z][A-Z0-9_]*_(?:SIZE|TAG|HEAD|LEN|BYTES)\b|\bsizeof \*?\w+(?:->\w+)?"

C_OPERATORS = [
    ("lt->le", r"(?<![<>=!])<(?![<=])", "<=", None),
    ("le->lt", r"<=", "<", None),
    ("gt->ge", r"(?<![<>=!-])>(?![>=])", ">=", None),
    ("ge->gt", r">=", ">", None),
    ("eq->ne", r"==", "!=", None),
    ("ne->eq", r"!=", "==", None),
    ("and->or", r"&&", "||", None),
    ("or->and", r"\|\|", "&&", None),
    ("inc->dec", r"\+\+", "--", None),
    ("dec->inc", r"--", "++", None),
    ("plus1->plus0", r"\+ 1\b", "+ 0", None),
    ("ok->eio", r"\breturn TP_OK;", "return TP_EIO;", None),
    ("not-dropped", r"if \(!", "if (", None),
    # Timeouts: units and rounding.
    ("time-unit", UNIT_RE, _unit, TIME_WORDS),
    ("ceil->floor", r"\bceil\(", "floor(", None),
    ("floor->ceil", r"\bfloor\(", "ceil(", None),
    ("round-up-dropped", r"\s*\+\s*9999*\b|\s*\+\s*\([^()]*%[^()]*!= 0\)", "", TIME_WORDS),
    # MACs: the compared (or copied) length one byte short, a size one off.
    ("mac-len-1", None, None, MAC_WORDS),   # see mac_len_mutants()
    ("mac-range+1", MAC_SIZE_RE, lambda m: f"({m.group(0)} + 1)", MAC_WORDS),
    ("mac-range-1", MAC_SIZE_RE, lambda m: f"({m.group(0)} - 1)", MAC_WORDS),
]

# Lines whose deletion is a plausible bug: a statement that calls, assigns or counts.
DELETABLE = re.compile(r"^\s+(?:[a-z_]+\([^;]*\);|[a-z_>\-\.\[\]]+\s*(?:=|\+=|-=)[^=][^;]*;|"
                       r"[a-z_>\-\.\[\]]+(?:\+\+|--);)\s*$")
# A timer started or a deadline armed (deleted as "unarmed", over several lines if need be).
ARMS = re.compile(r"^\s+(?:\(void\)\s*)?(?:[a-z_][\w]*(?:->|\.))*(?:uv_timer_start|\w*timer_arm|"
                  r"\w*_arm)\(")
# An assignment of a deadline (or a timer's due time): made "never" (UINT64_MAX).
DEADLINE_SET = re.compile(r"^(\s+(?:(?:const\s+)?u?int64_t\s+)?[\w>\-\.\[\]]*(?:deadline|due)\w*\s*=\s*)"
                          r"(?!=)(.*)$")

# A statement that only reports (its continuation lines are skipped too).
# A compile-time assertion is one too: a mutant of it either fails the build
# or changes nothing the program does.
REPORTS = re.compile(r"^\s*(?:return\s+)?(?:tpi_format|tpi_fail|tpi_log|snprintf|fprintf|TPI_ASSERT|"
                     r"assert|_Static_assert|static_assert)\b")
# va_end too: on x86-64 GCC and Clang it is __builtin_va_end, which emits no
# code, so its mutants leave the same machine code (seed 47 drew one).
SKIP = re.compile(r"^\s*(?:/?\*|//|#|TPI_ASSERT|assert|_Static_assert|static_assert|tpi_format|"
                  r"tpi_fail|return tpi_fail|va_end\b|"
                  r"char |static |typedef |case |default:)")
DECL = re.compile(r"^\s*(?:const\s+)?(?:u?int\d*_t|char|unsigned|size_t|int|void|long|ssize_t)\b")


def mask_literals(line):
    """The line with what is inside its string and character literals made
    'x', quotes kept, so that an operator is never found inside a literal
    and every position still names the same place in the line."""
    out = list(line)
    quote = None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and i + 1 < len(line):
                out[i] = out[i + 1] = "x"
                i += 2
                continue
            if ch == quote:
                quote = None
            else:
                out[i] = "x"
        elif ch in "\"'":
            quote = ch
        elif line.startswith("//", i) or line.startswith("/*", i):
            break  # a comment: left as it is (code_of drops it)
        i += 1
    return "".join(out)


def code_of(line):
    """The line without its comments (one-line /* */ and //), for statement ends."""
    line = re.sub(r"/\*.*?\*/", "", line)
    return line.split("//", 1)[0].rstrip()


def code_lines(lines):
    """Each line's code outside comments, block comments over several lines
    and string literals taken into account (a "tcp://" is no comment): what
    tells where the statement before a line ended."""
    out, inside = [], False
    for line in lines:
        code, k, n = [], 0, len(line)
        while k < n:
            if inside:
                e = line.find("*/", k)
                if e < 0:
                    k = n
                else:
                    k, inside = e + 2, False
                    code.append(" ")
            elif line.startswith("/*", k):
                inside, k = True, k + 2
            elif line.startswith("//", k):
                k = n
            elif line[k] in "\"'":
                q, e = line[k], k + 1
                while e < n and line[e] != q:
                    e += 2 if line[e] == "\\" else 1
                code.append(line[k:e + 1])
                k = e + 1
            else:
                code.append(line[k])
                k += 1
        out.append("".join(code).strip())
    return out


def statement_end(lines, i, limit=10):
    """The index of the line ending the statement that starts on line i, or None."""
    depth = 0
    for j in range(i, min(len(lines), i + limit)):
        code = code_of(lines[j])
        depth += code.count("(") - code.count(")")
        if depth <= 0 and code.endswith(";"):
            return j
        if code.endswith(("{", "}")):
            return None
    return None


def delete_statement(lines, i, marker):
    j = statement_end(lines, i)
    if j is None:
        return None
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    return ((i, f"{indent};  /* {marker} */"),) + tuple((k, "") for k in range(i + 1, j + 1))


def mac_len_mutants(line):
    """The last argument of a memcmp/memcpy family call closed on this line, one byte short."""
    out = []
    for m in re.finditer(r"\b(?:CRYPTO_memcmp|sodium_memcmp|timingsafe_bcmp|memcmp|memcpy)\(", line):
        depth, k, last_comma = 1, m.end(), None
        while k < len(line) and depth:
            ch = line[k]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch == "," and depth == 1:
                last_comma = k
            k += 1
        if depth or last_comma is None:
            continue
        a, b = last_comma + 1, k - 1
        arg = line[a:b].strip()
        out.append((a, b, f" ({arg}) - 1"))
    return out


def c_candidates(rel, text):
    lines = text.split("\n")
    out = []
    in_comment = False
    head = ""  # the first line of the statement line i belongs to
    codes = code_lines(lines)
    prev_code = ""  # the code of the last line before i that has any, comments left out
    for i, line in enumerate(lines):
        s = line.strip()
        if i and codes[i - 1]:
            prev_code = codes[i - 1]
        # A statement starts after one ended, a block opened or closed, a bare
        # if/for/while or a preprocessor line, whatever comments lie between.
        starts_statement = not prev_code or prev_code.endswith((";", "{", "}", "else")) or \
            bool(re.match(r"(?:\} else )?(?:if|for|while) \(.*\)$", prev_code)) or \
            prev_code.startswith("#")
        if starts_statement or prev_code.endswith(":"):
            head = line
        if in_comment:
            if "*/" in s:
                in_comment = False
            continue
        if s.startswith("/*") and "*/" not in s:
            in_comment = True
            continue
        if not s or SKIP.match(line) or REPORTS.match(head):
            continue
        # Operators are looked for outside string and character literals: a
        # line that quotes text (a strcmp with a word, a call with a name)
        # has its conditions and its statement mutated like any other.
        code = code_of(mask_literals(line))
        for name, pat, rep, cond in C_OPERATORS:
            if cond is not None and not cond.search(code):
                continue
            if name.startswith("mac-") and not MAC_FILES.match(rel):
                continue
            if name == "mac-len-1":
                for a, b, new in mac_len_mutants(code):
                    out.append(Mutant(rel, i, name, ((i, line[:a] + new + line[b:]),)))
                continue
            for m in re.finditer(pat, code):
                pre = code[:m.start()]
                if name.startswith("mac-range") and DECL.match(line) and pre.rfind("[") > pre.rfind("]"):
                    continue  # an array's size in a declaration: no range is checked there
                new = rep(m) if callable(rep) else rep
                out.append(Mutant(rel, i, name, ((i, line[:m.start()] + new + line[m.end():]),)))
        if not starts_statement:
            continue
        if ARMS.match(line):
            edits = delete_statement(lines, i, "unarmed")
            if edits:
                out.append(Mutant(rel, i, "unarmed", edits))
            continue
        d = DEADLINE_SET.match(line)
        if d and not re.match(r"\s*(?:UINT64_MAX|TPI_NO_DEADLINE)\s*;", d.group(2)):
            j = statement_end(lines, i)
            if j is not None:
                edits = ((i, d.group(1).rstrip() + " UINT64_MAX;  /* never armed */"),) + \
                    tuple((k, "") for k in range(i + 1, j + 1))
                out.append(Mutant(rel, i, "deadline-never", edits))
                continue
        # Matched without its comment: "stmt;  /* why */" is a statement too
        # (it was left out, 124 of them in common/ alone).
        if DELETABLE.match(code_of(line)):
            out.append(Mutant(rel, i, "delete", ((i, ";  /* deleted */"),)))
    return out


# ----------------------------------------------------------- Python operators

PY_CMP = {"<": ("lt->le", "<="), "<=": ("le->lt", "<"), ">": ("gt->ge", ">="),
          ">=": ("ge->gt", ">"), "==": ("eq->ne", "!="), "!=": ("ne->eq", "==")}
PY_NAMES = {"and": ("and->or", "or"), "or": ("or->and", "and"),
            "True": ("true->false", "False"), "False": ("false->true", "True")}


def py_candidates(rel, text):
    lines = text.split("\n")
    out = []

    def one(i, a, b, new, name):
        line = lines[i]
        out.append(Mutant(rel, i, name, ((i, line[:a] + new + line[b:]),)))

    toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for k, t in enumerate(toks):
        (r, c), (er, ec) = t.start, t.end
        if r != er:
            continue
        i = r - 1
        if t.type == tokenize.OP and t.string in PY_CMP:
            name, rep = PY_CMP[t.string]
            one(i, c, ec, rep, name)
        elif t.type == tokenize.NAME and t.string in PY_NAMES:
            name, rep = PY_NAMES[t.string]
            one(i, c, ec, rep, name)
        elif t.type == tokenize.NAME and t.string == "not":
            nxt = toks[k + 1] if k + 1 < len(toks) else None
            end = nxt.start[1] if nxt is not None and nxt.start[0] == r else ec
            one(i, c, end, "", "not-dropped")
        elif t.type == tokenize.NUMBER and re.fullmatch(r"\d+", t.string):
            v = int(t.string)
            one(i, c, ec, str(v + 1), "int+1")
            if v > 0:
                one(i, c, ec, str(v - 1), "int-1")

    # Statements: a call or an assignment deleted (pass), a return's value None.
    tree = ast.parse(text)
    for node in ast.walk(tree):
        is_call = isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        is_assign = isinstance(node, (ast.Assign, ast.AugAssign)) or \
            (isinstance(node, ast.AnnAssign) and node.value is not None)
        is_return = isinstance(node, ast.Return) and node.value is not None and \
            not (isinstance(node.value, ast.Constant) and node.value.value is None)
        if not (is_call or is_assign or is_return):
            continue
        i, j = node.lineno - 1, node.end_lineno - 1
        line = lines[i]
        indent = line[:len(line) - len(line.lstrip())]
        if node.col_offset != len(indent):
            continue  # not the line's first statement (a one-line `if x: y = 1`)
        rest = lines[j][node.end_col_offset:].strip()
        if rest and not rest.startswith("#"):
            continue  # another statement follows on its last line
        blanks = tuple((k, "") for k in range(i + 1, j + 1))
        if is_return:
            out.append(Mutant(rel, i, "return-none", ((i, indent + "return None"),) + blanks))
        else:
            out.append(Mutant(rel, i, "delete", ((i, indent + "pass"),) + blanks))
    return out


def candidates(files):
    out = []
    for rel in files:
        with open(os.path.join(ROOT, rel)) as f:
            text = f.read()
        out += py_candidates(rel, text) if rel.endswith(".py") else c_candidates(rel, text)
    return out


EQUIVALENT = os.path.join(ROOT, "scripts", "mutate_equivalent.txt")


def load_equivalent(path=EQUIVALENT):
    """{(file, original, mutant): [(reason, near)]}: blocks of a file line,
    '- ' the original statement, '+ ' the mutant, 'why: ' the reason; blank
    lines between blocks, '#' comments. Matched by text, so lines may move.
    When the same statement occurs twice in a file, the file line reads
    "FILE near TEXT": the entry is for the one with TEXT in one of the
    NEAR_LINES lines before it."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        blocks = f.read().split("\n\n")
    for b in blocks:
        lines = [l for l in b.strip().split("\n") if l and not l.startswith("#")]
        if not lines:
            continue
        if len(lines) < 4 or not (lines[1].startswith("- ") and lines[2].startswith("+ ")
                                  and lines[3].startswith("why: ")):
            raise SystemExit(f"mutate: {path}: a block needs a file, '- ', '+ ' and 'why: ' lines:\n{b}")
        rel, _, near = lines[0].strip().partition(" near ")
        out.setdefault((rel, lines[1][2:].strip(), lines[2][2:].strip()), []).append(
            (" ".join(l.strip() for l in lines[3:])[5:], near or None))
    return out


NEAR_LINES = 5


def equivalent_reason(equivalent, m, text):
    """The listed reason that applies to mutant m of the file's text, or None."""
    lines = text.split("\n")
    before = lines[max(0, m.line - NEAR_LINES):m.line]
    for reason, near in equivalent.get((m.rel, lines[m.line].strip(), m.edits[0][1].strip()), []):
        if near is None or any(near in l for l in before):
            return reason
    return None


def mutated_text(text, m):
    lines = text.split("\n")
    for i, new in m.edits:
        lines[i] = new
    return "\n".join(lines)


def valid(m, texts):
    """A Python mutant must still compile (a C one that does not is counted apart)."""
    if not m.rel.endswith(".py"):
        return True
    try:
        compile(mutated_text(texts[m.rel], m), m.rel, "exec")
        return True
    except SyntaxError:
        return False


def draw(pool, count, seed, folder, texts):
    """count mutants of one folder, the same for the same seed and tree."""
    order = sorted(pool)
    random.Random(f"{seed}:{folder}").shuffle(order)
    chosen = []
    for m in order:
        if len(chosen) == count:
            break
        if valid(m, texts):
            chosen.append(m)
    return sorted(chosen)


# ---------------------------------------------------------------------- tests

# Each test: name -> (build, CMake targets, argv, environment). In argv, {b} is
# the build folder, {t} the scratch tree. Build "lsan": LeakSanitizer;
# "py": plain, with the Python extension.
def _conf_tcp(env=None):
    return ("lsan", ["conformance_tcp"], ["{b}/tests/conformance/conformance_tcp"], env or {})


def _replay(name):
    return ("lsan", [name], ["{b}/fuzz/" + name, "{t}/fuzz/corpus/" + name], {})


def _pytest(path, *extra, env=None):
    # The shared library too: test_c_peer.py loads it beside tprun (else it skips).
    return ("py", ["tensorplay_py", "tprun", "tensorplay_rpc_shared"],
            [PYTHON, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *extra, "{t}/" + path],
            dict({"PYTHONPATH": "{b}/python", "TPRUN": "{b}/real/tprun", "PYTHON": PYTHON},
                 **(env or {})))


TESTS = {
    # common/: the core on the simulator.
    "conformance_sim": ("lsan", ["conformance_sim"], ["{b}/tests/conformance/conformance_sim"], {}),
    **{n: ("lsan", [n], ["{b}/tests/" + n], {}) for n in
       ["test_future", "test_timeout", "test_shutdown", "test_init", "test_send_failure",
        "test_rejoin", "test_codec", "test_value", "test_frame", "test_interrupt",
        "test_rref_faults", "test_flow_break", "test_shm_ring", "test_dedupe", "test_blocks",
        "test_fair", "test_idmap", "test_log", "test_names", "test_options", "test_sim",
        "test_store", "test_teardown_late"]},
    "swarm": ("lsan", ["tpsim"], ["{b}/tools/tpsim", "swarm", "--seeds", "1..150"], {}),
    "swarm16": ("lsan", ["tpsim"], ["{b}/tools/tpsim", "swarm", "--seeds", "1001..1010",
                                    "--workers", "16"], {}),
    # make test's chaos worlds (loss, duplicates, reordering: AGENT-17's paths).
    "swarm_chaos": ("lsan", ["tpsim"], ["sh", "-c",
                                        "{b}/tools/tpsim swarm --seeds 1..25 --chaos --plan "
                                        "{t}/tools/workloads/chaos_loss.plan && "
                                        "{b}/tools/tpsim swarm --seeds 1..50 --chaos"], {}),
    "scenarios": ("lsan", ["tpsim"], ["sh", "-c", " && ".join(
        f"{{b}}/tools/tpsim --scenario {s} --workers 5 --seed 3 >/dev/null"
        for s in ["fanout", "nested", "remote", "shutdown_load", "worker_death"])], {}),
    **{"replay_" + n: _replay(n) for n in
       ["fuzz_msg_decode", "fuzz_core_frames", "fuzz_tcp_conn", "fuzz_tcp_crypt",
        "fuzz_tcp_records", "fuzz_tcp_shm", "fuzz_store_request", "fuzz_store_reply",
        "fuzz_store_contents", "fuzz_shm_ring"]},
    # real/: the TCP transport, one process per rank on 127.0.0.1.
    **{n: ("lsan", [n], ["{b}/tests/tcp/" + n], {}) for n in
       ["test_tcp", "test_tcp_ipv6", "test_tcp_crypt", "test_tcp_store", "test_tcp_shm",
        "test_tcp_bounds", "net_storm", "test_tcp_direct"]},
    "tcp_pingpong": ("lsan", ["tcp_pingpong"], ["{b}/tests/tcp/tcp_pingpong", "300"], {}),
    **{"test_tcp_oom_rank%d" % r: ("lsan", ["test_tcp_oom"], ["{b}/tests/tcp/test_tcp_oom"],
                                   {"TP_OOM_RANK": str(r)}) for r in (0, 1)},
    "test_tcp_keepalive": ("lsan", ["test_tcp_keepalive"], ["{b}/tests/netns/test_tcp_keepalive"],
                           {}),
    # TCP-23, TCP-25 on real kernels (as root; 77 otherwise): a host cut while
    # calls wait on it, one cut for good until declared down, and one healed
    # before it would be (about 40 s; netns_partitions runs every scenario).
    "netns_silent": ("lsan", ["netns_worker"], ["{t}/tests/netns/netns_test.sh",
                                               "{b}/tests/netns/netns_worker", "cut", "down",
                                               "rescue"], {}),
    "tprun_test": ("lsan", ["tprun", "add_tcp", "fail_malloc"],
                   ["{t}/tests/tcp/tprun_test.sh", "{b}/real/tprun", "{b}/examples/add_tcp",
                    "{b}/tests/tcp/libfail_malloc.so"], {}),
    "example_param_server": ("lsan", ["tprun", "param_server"],
                             ["{b}/real/tprun", "--nproc", "4", "{b}/examples/param_server"], {}),
    "conformance_tcp_sqlite": _conf_tcp(),
    "conformance_tcp_tcpstore": _conf_tcp({"TP_CONFORMANCE_STORE": "tcp"}),
    "conformance_tcp_shm": _conf_tcp({"TP_CONFORMANCE_SHM": "all"}),
    # A deleted lock or unlock: ThreadSanitizer (a race is seldom seen otherwise).
    "tsan_test_tcp": ("tsan", ["test_tcp"], ["{b}/tests/tcp/test_tcp"],
                      {"TSAN_OPTIONS": "suppressions={t}/tests/tsan.supp"}),
    "tsan_conformance_tcp": ("tsan", ["conformance_tcp"],
                             ["{b}/tests/conformance/conformance_tcp"],
                             {"TSAN_OPTIONS": "suppressions={t}/tests/tsan.supp"}),
    # python/: the package through tprun-started workers; the seed 5 times, not 200.
    "python_run": _pytest("python/tests/test_run.py"),
    "python_rpc": _pytest("python/tests", "--ignore={t}/python/tests/test_run.py",
                          "--ignore={t}/python/tests/test_install.py",
                          "--ignore={t}/python/tests/test_pytorch_compat.py",
                          "--ignore={t}/python/tests/torch_suite"),
    "python_pytorch_compat": _pytest("python/tests/test_pytorch_compat.py",
                                     env={"TP_SEED_RUNS": "5"}),
    "python_examples": ("py", ["tensorplay_py", "tprun"], ["sh", "-c", (
        'set -e; out=$("$0" --nproc 2 "$1" "$2/seed.py"); test "$out" = "[0] 7"; '
        '"$0" --nproc 3 "$1" "$2/param_server.py" | grep -c converged | grep -qx 2; '
        '"$0" --nproc 3 "$1" "$2/pipeline.py" | grep -q "pipeline: True"'),
        "{b}/real/tprun", PYTHON, "{t}/examples/python"], {"PYTHONPATH": "{b}/python"}),
}

COMMON_CORE = ["conformance_sim", "test_future", "test_timeout", "test_shutdown", "test_init",
               "test_send_failure", "test_rejoin", "test_interrupt", "test_rref_faults",
               "test_flow_break", "test_dedupe", "swarm", "swarm16", "swarm_chaos", "scenarios",
               # every other unit test of common/: each runs in well under a second
               "test_blocks", "test_fair", "test_idmap", "test_log", "test_names", "test_options",
               "test_sim", "test_store", "test_teardown_late"]
CODEC = ["test_value", "test_codec", "test_frame", "replay_fuzz_msg_decode",
         "replay_fuzz_core_frames", "conformance_sim", "swarm", "swarm16", "scenarios"]
REAL_BASE = ["replay_fuzz_tcp_conn", "test_tcp_ipv6", "test_tcp", "tcp_pingpong",
             "example_param_server", "test_tcp_crypt", "test_tcp_shm", "test_tcp_bounds",
             "net_storm", "conformance_tcp_sqlite", "test_tcp_keepalive", "test_tcp_direct",
             "test_tcp_oom_rank0", "test_tcp_oom_rank1"]
STORE = ["replay_fuzz_store_request", "replay_fuzz_store_reply", "replay_fuzz_store_contents",
         "test_tcp_store", "conformance_tcp_tcpstore"]
PY_RPC = ["python_examples", "python_rpc", "python_pytorch_compat"]

# The tests each file's mutants run (the first match wins): its own tests, then
# its folder's. They run cheapest first by what each took on the unmutated
# tree, a file's own tests counted at a quarter of their time.
FILE_TESTS = [
    (r"common/(codec|value|frame)\.c", ["test_value", "test_codec", "test_frame",
                                        "replay_fuzz_msg_decode", "replay_fuzz_core_frames"], CODEC),
    (r"common/", [], COMMON_CORE),
    (r"real/tprun\.c", ["tprun_test", "example_param_server"], []),
    (r"real/tcp_(crypt|auth)\.c", ["replay_fuzz_tcp_crypt", "test_tcp_crypt"], REAL_BASE),
    (r"real/tcp_records\.c", ["replay_fuzz_tcp_records"], REAL_BASE),
    (r"real/tcp_shm\.c", ["replay_fuzz_tcp_shm", "test_tcp_shm", "conformance_tcp_shm"], REAL_BASE),
    (r"real/shm_ring\.c", ["test_shm_ring", "replay_fuzz_shm_ring", "test_tcp_shm"],
     REAL_BASE),  # TCP-26, and connections' rings (TCP-28)
    (r"real/tcp_(store\w*|sock)\.c", STORE, REAL_BASE),
    (r"real/tcp_conn\.c", [], REAL_BASE + ["netns_silent"]),
    (r"real/tcp_addr\.c", ["test_tcp_store"], REAL_BASE),  # its address parsing, case by case
    (r"real/", [], REAL_BASE),
    (r"python/tensorplay/distributed/run\.py", ["python_run"], []),
    (r"python/", [], PY_RPC),
]


def tests_for(rel):
    """(the file's own tests, all its tests)."""
    for pat, own, base in FILE_TESTS:
        if re.match(pat, rel):
            return own, list(dict.fromkeys(own + base))
    raise SystemExit(f"mutate: no tests for {rel}")


# A mutant that deletes a lock or an unlock in C: its tests also run under
# ThreadSanitizer over TCP, where threads really run at once (the simulator's
# tasks never do). Unlocking a mutex not held is silent in glibc.
LOCK_CALL = re.compile(r"\b(pthread_mutex_(un)?lock|pthread_rwlock_\w*lock|tpi_(un)?lock)\s*\(")
TSAN_TESTS = {"common": ["tsan_conformance_tcp"], "real": ["tsan_test_tcp"]}


def tests_of(m, orig):
    """(own, all) for mutant m whose original line is orig."""
    own, names = tests_for(m.rel)
    if m.op == "delete" and LOCK_CALL.search(orig):
        extra = TSAN_TESTS.get(folder_of(m.rel), [])
        own, names = own + extra, names + extra
    return own, names


# LeakSanitizer alone (-fsanitize=leak) has no fiber API: a malloc made on a
# simulator task's stack (sim/sim_task.c) unwinds no further than its own
# frame, and LSan treats a chunk with no caller PC as reachable ("may be
# allocated in a coroutine"), with everything it points to. Every worker core
# is allocated on such a stack, so without the slow (DWARF) unwinder no leak
# of the core would ever be reported. ASan builds (TP_SANITIZE) tell the
# sanitizer about each switch and do not need this. Reports go to /dev/null:
# unsymbolized, a leaking mutant's conformance run ends well inside --timeout.
# The TCP tests, the isolated codec tests and the fuzz replays run no
# simulator task: the fast unwinder sees their leaks (test_codec takes 31 s
# with the slow one, 2 s with the fast).
SIM_TESTS = {"conformance_sim", "swarm", "swarm16", "scenarios", "test_future", "test_timeout",
             "test_shutdown", "test_init", "test_send_failure", "test_rejoin", "test_interrupt",
             "test_rref_faults", "test_flow_break", "test_dedupe", "swarm_chaos"}


# What ASan costs over the LeakSanitizer build's time limit. Measured as
# make test SANITIZE=1 over make test in one CI run: the simulator's worlds
# 5-31x (tpsim_swarm_sample 31x, tpsim_swarm_chaos_loss 14x, conformance_sim
# 8x: every task switch goes through the sanitizer's fiber calls and fake
# stacks), every other test at most 3.2x. At 3x for all, swarm_chaos (2.5 s
# unmutated here, so 20 s, and 60 s under ASan) ran out of time unmutated
# under ASan on a loaded machine, and a survivor's ASan verdict was lost
# (seed 22's rref.c:484, "flaky"). A limit is at least --timeout before the
# factor.
ASAN_FACTOR_SIM = 12
ASAN_FACTOR = 3


def lsan_env(slow_unwind):
    opts = [os.environ.get("LSAN_OPTIONS", ""), "symbolize=0"]
    if slow_unwind:
        opts.append("fast_unwind_on_malloc=0")
    return dict(os.environ, LSAN_OPTIONS=":".join(o for o in opts if o))


class Runner:
    def __init__(self, tree, jobs, timeout, mutant_timeout):
        self.tree, self.jobs = tree, jobs
        self.timeout, self.mutant_timeout = timeout, mutant_timeout
        self.builds = {"lsan": os.path.join(tree, "build-mutate"),
                       "py": os.path.join(tree, "build-mutate-py"),
                       "tsan": os.path.join(tree, "build-mutate-tsan"),
                       "asan": os.path.join(tree, "build-mutate-asan")}
        self.configured = set()
        self.baseline = {}  # test -> seconds on the unmutated tree
        self.broken = set()  # tests failing unmutated: left out

    def configure(self, kind):
        if kind in self.configured:
            return
        b = self.builds[kind]
        if kind == "lsan":
            # LeakSanitizer (cheap, unlike ASan): a mutant that leaks is killed too.
            flags = ["-DTP_BUILD_FUZZ=ON", "-DCMAKE_C_FLAGS=-fsanitize=leak",
                     "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=leak"]
        elif kind == "asan":
            # make test SANITIZE=1's build: only survivors of C mutants come here.
            flags = ["-DTP_BUILD_FUZZ=ON", "-DTP_SANITIZE=ON"]
        elif kind == "tsan":
            flags = ["-DTP_BUILD_FUZZ=OFF", "-DCMAKE_C_FLAGS=-fsanitize=thread",
                     "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread",
                     "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread"]
        else:
            flags = ["-DTP_BUILD_FUZZ=OFF", f"-DPython3_EXECUTABLE={PYTHON}"]
        subprocess.run(["cmake", "-S", self.tree, "-B", b] + flags, check=True,
                       stdout=subprocess.DEVNULL)
        self.configured.add(kind)

    def make(self, names, asan=False):
        by_kind = {}
        for n in names:
            kind, targets = TESTS[n][0], TESTS[n][1]
            by_kind.setdefault("asan" if asan else kind, set()).update(targets)
        for kind, targets in sorted(by_kind.items()):
            self.configure(kind)
            r = subprocess.run(["cmake", "--build", self.builds[kind], "-j", str(self.jobs),
                                "--target"] + sorted(targets),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode != 0:
                return False
        return True

    def run_one(self, name, limit, asan=False, log=None):
        """None when the test passes, else why it failed. asan: in the ASan build.
        log: a file for the test's output (else it is dropped)."""
        kind, _, argv, env = TESTS[name]
        b = self.builds["asan" if asan else kind]
        sub = {"{b}": b, "{t}": self.tree}

        def fill(s):
            for k, v in sub.items():
                s = s.replace(k, v)
            return s
        e = lsan_env(name in SIM_TESTS and not asan)
        e.update({k: fill(v) for k, v in env.items()})
        if asan:
            e["ASAN_OPTIONS"] = "detect_leaks=1:symbolize=0"
            e["UBSAN_OPTIONS"] = "print_stacktrace=0:halt_on_error=1"
        # Its own session: a timeout kills the forked ranks too, and nothing a
        # mutant left running outlives its test.
        out = open(log, "wb") if log else subprocess.DEVNULL
        try:
            p = subprocess.Popen([fill(a) for a in argv], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=e, cwd=self.tree,
                                 start_new_session=True)
        finally:
            if log:
                out.close()
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = None
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if rc is None:
            p.wait()
            return f"{name} (hung past {limit:.0f} s)"
        if rc == 77 and name in ("test_tcp_ipv6", "netns_silent"):
            return None  # skipped: no ::1 here, or not root
        if rc != 0:
            return name + (f" (signal {-rc})" if rc < 0 else "") + (" under ASan/UBSan" if asan else "")
        return None

    def limit(self, name, asan=False):
        base = self.baseline.get(name)
        lim = self.timeout if base is None else max(self.timeout, 4 * base + 10)
        if not asan:
            return lim
        return (ASAN_FACTOR_SIM if name in SIM_TESTS else ASAN_FACTOR) * lim

    def measure(self, names):
        """The unmutated tree: each test's time; tests that fail twice are left out."""
        todo = [n for n in names if n not in self.baseline and n not in self.broken]
        if not todo:
            return True
        if not self.make(todo):
            return False
        for n in todo:
            log = os.path.join(tempfile.gettempdir(), f"tp-mutate-baseline-{n}.log")
            for attempt in range(2):
                t0 = time.time()
                why = self.run_one(n, max(self.timeout, 300), log=log)
                if why is None:
                    self.baseline[n] = time.time() - t0
                    break
            else:
                # Its output says why (a port another job took, a package
                # missing): a test left out kills no mutant, so look.
                print(f"mutate: {why} fails on the unmutated tree: left out; its output: {log}",
                      flush=True)
                self.broken.add(n)
        return True

    def run_tests(self, own, names, asan=False):
        """Cheapest first; the first failure kills. Stops at the mutant's time limit."""
        order = sorted((n for n in names if n not in self.broken),
                       key=lambda n: (self.baseline.get(n, 1e9) / (4 if n in own else 1), n))
        t0 = time.time()
        for n in order:
            left = self.mutant_timeout * (3 if asan else 1) - (time.time() - t0)
            if left <= 0:
                return n, f"{n} (past the mutant's {self.mutant_timeout} s)"
            why = self.run_one(n, min(self.limit(n, asan), left), asan)
            if why:
                return n, why
        return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=60, help="mutants per folder")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--folders", default=",".join(FOLDERS),
                    help="folders to mutate, among " + ",".join(FOLDERS))
    ap.add_argument("--files", help="files to mutate instead of the folders' defaults")
    ap.add_argument("--keep", help="scratch folder to use and keep")
    ap.add_argument("--timeout", type=int, default=20,
                    help="seconds a test may run at least (else 4x its unmutated time + 10 s)")
    ap.add_argument("--mutant-timeout", type=int, default=600,
                    help="seconds all of one mutant's tests may take (past it: killed)")
    ap.add_argument("--recheck", action="store_true",
                    help="run a killing test again on the unmutated tree: if it fails there too, "
                         "the mutant is not counted (flaky)")
    ap.add_argument("--json", help="write the results to this file as JSON")
    ap.add_argument("--list", action="store_true", help="list the candidates and the drawn mutants only")
    ap.add_argument("--at", help="FILE:LINE[:OP],...: these mutants instead of a draw")
    args = ap.parse_args()

    if args.files:
        files = [f for f in args.files.split(",") if f]
        folders = list(dict.fromkeys(folder_of(f) for f in files))
    else:
        folders = [f for f in args.folders.split(",") if f]
        bad = [f for f in folders if f not in FOLDERS]
        if bad:
            ap.error(f"unknown folder {','.join(bad)} (folders: {','.join(FOLDERS)})")
        files = [rel for f in folders for rel in default_files(f)]
    texts = {}
    for rel in files:
        with open(os.path.join(ROOT, rel)) as f:
            texts[rel] = f.read()
    pools = {f: [] for f in folders}
    for m in candidates(files):
        pools[folder_of(m.rel)].append(m)
    chosen = []
    if args.at:
        want = [a.split(":") for a in args.at.split(",") if a]
        if any(len(w) not in (2, 3) or not w[1].isdigit() for w in want):
            ap.error("--at takes FILE:LINE[:OP],...")
        chosen = sorted(m for f in folders for m in pools[f] if valid(m, texts) and any(
            m.rel == w[0] and m.line + 1 == int(w[1]) and (len(w) == 2 or m.op == w[2])
            for w in want))
        if not chosen:
            ap.error(f"no candidate mutant at {args.at} (see --list)")
    else:
        for f in folders:
            chosen += draw(pools[f], args.count, args.seed, f, texts)
    print(f"mutate: {sum(len(p) for p in pools.values())} candidate mutants in {len(files)} files "
          f"({', '.join(f'{f} {len(pools[f])}' for f in folders)}); testing {len(chosen)} "
          f"(seed {args.seed}, {args.count} per folder)", flush=True)
    if args.list:
        for f in folders:
            ops = Counter(m.op for m in pools[f])
            per_file = Counter(m.rel for m in pools[f])
            print(f"{f}: {len(pools[f])} candidates in {len(per_file)} files")
            print("  by operator: " + ", ".join(f"{o} {n}" for o, n in sorted(ops.items())))
            print("  by file: " + ", ".join(f"{os.path.basename(r)} {n}"
                                            for r, n in sorted(per_file.items())))
        for m in chosen:
            orig = texts[m.rel].split("\n")[m.line].strip()
            print(f"  {m.rel}:{m.line + 1} {m.op}\n    - {orig}\n    + {m.edits[0][1].strip()}")
        return 0

    tree = args.keep or tempfile.mkdtemp(prefix="tp-mutate.")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(ROOT, tree, symlinks=True,
                    ignore=shutil.ignore_patterns("build*", ".git", "__pycache__"))
    pristine = {}
    for rel in files:
        with open(os.path.join(tree, rel)) as f:
            pristine[rel] = f.read()
    # A deleted assignment can leave a variable unused: with -Werror that
    # mutant would not compile and would not count, so the scratch tree
    # builds with warnings as warnings.
    cml = os.path.join(tree, "CMakeLists.txt")
    with open(cml) as f:
        text = f.read()
    with open(cml, "w") as f:
        f.write(text.replace("-Wall -Wextra -Werror", "-Wall -Wextra"))
    runner = Runner(tree, args.jobs, args.timeout, args.mutant_timeout)
    equivalent = load_equivalent()

    t_start = time.time()
    needed = list(dict.fromkeys(
        n for m in chosen for n in tests_of(m, pristine[m.rel].split("\n")[m.line])[1]))
    if not runner.measure(needed):
        print("mutate: the unmutated tree does not build; nothing to measure")
        return 2
    print("mutate: unmutated tree: " + ", ".join(
        f"{n} {runner.baseline[n]:.1f} s" for n in sorted(runner.baseline, key=runner.baseline.get))
        + f" (set up in {time.time() - t_start:.0f} s)", flush=True)

    results = []
    t0 = time.time()
    for n, m in enumerate(chosen, 1):
        orig = pristine[m.rel].split("\n")[m.line]
        own, names = tests_of(m, orig)
        with open(os.path.join(tree, m.rel), "w") as f:
            f.write(mutated_text(pristine[m.rel], m))
        where = f"{m.rel}:{m.line + 1} {m.op}"
        t1 = time.time()
        by = None
        if not runner.make(names):
            result = "invalid"
            verdict = "does not compile"
        else:
            test, by = runner.run_tests(own, names)
            result = "killed" if by else "survived"
            verdict = f"killed by {by}" if by else "SURVIVED"
        # The sanitizer build for a C survivor (see the top); only the tests
        # that run in the LeakSanitizer build have an ASan twin.
        asan_names = [n for n in names if TESTS[n][0] == "lsan"]
        asan_test = None
        if result == "survived" and m.rel.endswith(".c") and asan_names and \
                runner.make(asan_names, asan=True):
            asan_test, asan_by = runner.run_tests(own, asan_names, asan=True)
            if asan_by:
                result, by, verdict = "killed", asan_by, f"killed by {asan_by}"
        # From the copy taken at the start: the working tree may have moved on.
        with open(os.path.join(tree, m.rel), "w") as f:
            f.write(pristine[m.rel])
        # A test that fails unmutated too keeps its output: a flaky test is
        # found by reading it, not by running it again until it fails.
        flaky_log = os.path.join(tempfile.gettempdir(),
                                 f"tp-mutate-flaky-{m.rel.replace('/', '_')}-{m.line + 1}.log")
        if asan_test and result == "killed" and runner.make([asan_test], asan=True) and \
                runner.run_one(asan_test, runner.limit(asan_test, True), asan=True,
                               log=flaky_log):
            result = "flaky"
            verdict += (f"; {asan_test} fails unmutated under ASan too: not counted "
                        f"(its output: {flaky_log})")
        if result == "killed" and not asan_test and args.recheck and runner.make([test]) and \
                runner.run_one(test, runner.limit(test), log=flaky_log):
            result = "flaky"
            verdict += f"; {test} fails unmutated too: not counted (its output: {flaky_log})"
        known = equivalent_reason(equivalent, m, pristine[m.rel])
        if known is not None and result == "survived":
            result = "equivalent"
            verdict = "survived, equivalent: " + known
        elif known is not None and result == "killed":
            verdict += " (listed as equivalent in scripts/mutate_equivalent.txt: wrongly)"
        secs = time.time() - t1
        results.append({"file": m.rel, "line": m.line + 1, "op": m.op, "folder": folder_of(m.rel),
                        "result": result, "by": by, "seconds": round(secs, 1),
                        "orig": orig.strip(), "new": m.edits[0][1].strip()})
        print(f"[{n}/{len(chosen)}] {where}: {verdict} ({secs:.1f} s)", flush=True)
    if args.keep:
        runner.make(needed)  # the kept tree built as it is

    summary = {}
    print(f"\nmutate: seed {args.seed}, {len(chosen)} mutants in {time.time() - t0:.0f} s")
    print(f"  {'folder':8} {'candidates':>10} {'tested':>6} {'killed':>6} {'survived':>8} "
          f"{'equivalent':>10} {'no-compile':>10} {'flaky':>5} {'score':>7}")
    for f in folders + ["overall"]:
        rs = [r for r in results if f == "overall" or r["folder"] == f]
        k = sum(r["result"] == "killed" for r in rs)
        s = sum(r["result"] == "survived" for r in rs)
        inv = sum(r["result"] == "invalid" for r in rs)
        flaky = sum(r["result"] == "flaky" for r in rs)
        eq = sum(r["result"] == "equivalent" for r in rs)
        cand = sum(len(p) for p in pools.values()) if f == "overall" else len(pools[f])
        score = 100.0 * k / (k + s) if k + s else None
        summary[f] = {"candidates": cand, "tested": len(rs), "killed": k, "survived": s,
                      "equivalent": eq, "invalid": inv, "flaky": flaky, "score": None if score is None else round(score, 1)}
        print(f"  {f:8} {cand:>10} {len(rs):>6} {k:>6} {s:>8} {eq:>10} {inv:>10} {flaky:>5} "
              f"{'-' if score is None else f'{score:.1f}%':>7}")
    for r in results:
        if r["result"] == "survived":
            print(f"  survived {r['file']}:{r['line']} {r['op']}\n    - {r['orig']}\n    + {r['new']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "count_per_folder": args.count, "folders": folders,
                       "baseline_seconds": {n: round(t, 2) for n, t in runner.baseline.items()},
                       "left_out": sorted(runner.broken), "summary": summary,
                       "mutants": results}, f, indent=1)
    if not args.keep:
        shutil.rmtree(tree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    # A script's background job (`mutate.py &`) starts with SIGINT ignored,
    # and every test inherits that: a Ctrl-C test's program then never sees
    # its SIGINT and hangs (python_pytorch_compat failed the baseline so,
    # and killed no mutant for two draws). A handler here is reset to the
    # default in each test at exec, as a terminal's programs have it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
