"""Runs PyTorch 1.13's own rpc tests (rpc_test.py: RpcTest, TensorPipeAgentRpcTest)
against tensorplay.distributed.rpc, or against torch itself as the control.

    python3 runner.py --mode default|pickle|control [--tests REGEX] [--json OUT]

A coordinator (this process, or the pytest process) starts a world of 4 rank
processes that import torch once and then run the tests in lockstep: for each
test it sends every rank the same command (test, TCP port, store file), and
each rank reports pass / fail with the traceback / skip to its results file.
The test's own dist_init does init_rpc and shutdown, the barrier inside a
test. Unlike MultiProcessTestCase, a world lives across tests (torch costs
1-2 s per process to import); it is killed and a new one started after a
test that failed, hung past its deadline, or lost a rank, since a rank that
raised inside a test leaves its RPC agent up.

Modes: "control" runs torch.distributed.rpc; "default" and "pickle" run
ours, the latter with TensorPipeRpcBackendOptions(allow_pickle=True) in the
fixture's options.
"""
import argparse
import faulthandler
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scope  # noqa: E402
import shims  # noqa: E402

WORLD_SIZE = 4  # RpcAgentTestFixture.world_size
MODES = ("control", "default", "pickle")
START_DEADLINE_S = 90.0  # 4 torch imports on 2 shared cores
# Once a rank has failed, the others are often stuck in a shutdown waiting
# for it; the test has failed anyway, so wait only this long for their reports.
GRACE_AFTER_FAIL_S = 5.0
# A test's child that reported waits this long at most for the release.
RELEASE_WAIT_S = 120.0


# ---------------------------------------------------------------- rank side

def _make_case(mod, cls_name, rpc, pickle):
    """The runnable test class: our fixture + rpc_test's class + torch's
    TestCase (assertEqual on tensors), as rpc_utils.generate_tests composes
    TensorPipeRpcAgentTestFixture + RpcTest + MultiProcessTestCase."""
    from torch.testing._internal.common_utils import TestCase

    from torch.testing._internal.common_distributed import tp_transports

    class AdapterFixture(mod.RpcAgentTestFixture):
        """tensorpipe_rpc_agent_test_fixture.py as torch writes it, for the
        module under test, plus allow_pickle=True in pickle mode."""

        @property
        def rpc_backend(self):
            return rpc.backend_registry.BackendType["TENSORPIPE"]

        @property
        def rpc_backend_options(self):
            extra = {"allow_pickle": True} if pickle else {}
            return rpc.backend_registry.construct_rpc_backend_options(
                self.rpc_backend, init_method=self.init_method, _transports=tp_transports(),
                **extra)

        def get_shutdown_error_regex(self):
            return "(.*)"  # torch's TensorPipe fixture says the same

        def get_timeout_error_regex(self):
            return "RPC ran for more than"

    # A module-level class of the test module, as torch's generated classes
    # are: tests pass bound methods of self over RPC, pickled by class name.
    name = "Adapted" + cls_name
    cls = type(name, (AdapterFixture, getattr(mod, cls_name), TestCase),
               {"__module__": mod.__name__, "__qualname__": name})
    setattr(mod, name, cls)
    return cls


def _error(e):
    """'Type: message' of an exception (the message's first line: a remote
    error's message carries the remote traceback)."""
    msg = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, msg[0] if msg else "")


def _run_one(mod, rpc, cmd, rank, mode, skip_codes):
    """(outcome, 'Type: message', traceback) of one test, in a forked child."""
    import unittest
    os.environ["MASTER_PORT"] = str(cmd["port"])
    try:
        case = _make_case(mod, cmd["cls"], rpc, mode == "pickle")(cmd["test"])
        case.rank = rank
        case.file_name = cmd["file"]
        method = getattr(case, cmd["test"])
        # unittest's own skip marks (sandcastle_skip_if sets them; dist_init
        # copies them onto its wrapper), which only TestCase.run would honour.
        for marked in (type(case), method):
            if getattr(marked, "__unittest_skip__", False):
                return "skip", getattr(marked, "__unittest_skip_why__", ""), ""
        method()
        return "pass", "", ""
    except unittest.SkipTest as e:
        return "skip", str(e), ""
    except SystemExit as e:  # common_distributed's skip decorators exit with a code
        if e.code in skip_codes:
            return "skip", skip_codes[e.code], ""
        return "fail", "SystemExit(%r)" % (e.code,), traceback.format_exc()
    except BaseException as e:
        return "fail", _error(e), traceback.format_exc()


def worker_main(args):
    """A rank: imports torch and loads the test module once, then forks a
    child per test. The child is the fresh process torch expects (its RRef
    context is a process-wide singleton bound to the first agent, so RRefs
    break after a second init_rpc in one process) without paying the import."""
    sys.argv = sys.argv[:1]  # common_utils parses sys.argv when imported
    shims.install_expecttest_stub()
    os.environ.update(RPC_INIT_WITH_TCP="1", MASTER_ADDR="127.0.0.1")
    out = open(args.results, "a", buffering=1)
    child_out = args.results + ".child"
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # World.kill_children(dump)

    def emit(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    from torch.testing._internal.common_distributed import TEST_SKIPS
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    mod, rpc = shims.load_test_module(args.mode)
    emit({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        print("=== %s.%s" % (cmd["cls"], cmd["test"]), flush=True)
        t0 = time.monotonic()
        if os.path.exists(child_out):
            os.unlink(child_out)
        pid = os.fork()
        if pid == 0:
            try:
                outcome, error, tb = _run_one(mod, rpc, cmd, args.rank, args.mode, skip_codes)
                with open(child_out + ".tmp", "w") as f:
                    json.dump({"outcome": outcome, "error": error, "traceback": tb}, f)
                os.rename(child_out + ".tmp", child_out)
                sys.stdout.flush()
                sys.stderr.flush()
                # Exit only when every rank has finished the test: rank 0's
                # process hosts the TCP store the others' shutdown still uses
                # (torch's agent.join), and a prompt exit resets it.
                limit = time.monotonic() + RELEASE_WAIT_S
                while not os.path.exists(cmd["release"]) and time.monotonic() < limit:
                    time.sleep(0.01)
            finally:
                os._exit(0)  # no atexit, no joining the threads the test left
        emit({"started": cmd["index"], "pid": pid})
        rec, status = None, None
        while rec is None and status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            try:
                with open(child_out) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                if status is None:
                    time.sleep(0.01)
        if rec is None:
            rec = {"outcome": "fail", "traceback": "",
                   "error": "the test's process died (%s)" % _status(status)}
        rec.update(index=cmd["index"], secs=round(time.monotonic() - t0, 3))
        emit(rec)
        if status is None:
            os.waitpid(pid, 0)  # until the coordinator's release, or a kill
    out.close()


def _status(status):
    if os.WIFSIGNALED(status):
        return "signal %d" % os.WTERMSIG(status)
    return "exit code %d" % os.WEXITSTATUS(status)


# ---------------------------------------------------------- coordinator side

def free_port():
    """A port for the next test's store, below the kernel's ephemeral range
    when the launcher's helper is there (the package's pure-Python
    launcher): a port the kernel picks for port 0 comes from that range,
    where another process's outgoing connection may take it before rank 0
    binds it (CI saw "Address already in use" so)."""
    try:
        from tensorplay.distributed.run import free_port as below_ephemeral
    except ImportError:
        below_ephemeral = None
    if below_ephemeral is not None:
        return below_ephemeral("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    """WORLD_SIZE rank processes of one mode, each in its own session so that
    kill() reaches whatever it started."""

    def __init__(self, mode, log_dir, number):
        self.procs, self.paths, self.offsets, self.records = [], [], [], []
        self.log_paths = []
        # The coordinator is the launcher: like tprun, it hands its processes
        # a fresh job secret (spec/tcp.md TCP-17) in the environment.
        env = dict(os.environ)
        env.setdefault("TP_SECRET", secrets.token_hex(32))
        for rank in range(WORLD_SIZE):
            res = os.path.join(log_dir, "world%d_rank%d.jsonl" % (number, rank))
            log = os.path.join(log_dir, "world%d_rank%d.log" % (number, rank))
            with open(log, "w") as logf:
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(rank),
                     "--mode", mode, "--results", res],
                    stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT, text=True,
                    env=env, start_new_session=True))
            self.paths.append(res)
            self.log_paths.append(log)
            self.offsets.append(0)
            self.records.append([])

    def _poll(self):
        for rank, path in enumerate(self.paths):
            try:
                with open(path) as f:
                    f.seek(self.offsets[rank])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind("\n") + 1  # complete lines only
            self.offsets[rank] += end
            self.records[rank] += [json.loads(l) for l in data[:end].splitlines() if l]

    def _find(self, rank, pred):
        return next((r for r in self.records[rank] if pred(r)), None)

    def wait(self, pred, deadline_s):
        """{rank: record} of the records matching pred, and the problem when
        not all ranks gave one: deadline, dead rank, or others stuck after a
        failure."""
        start, failed_at = time.monotonic(), None
        while True:
            self._poll()
            got = {}
            for rank in range(WORLD_SIZE):
                rec = self._find(rank, pred)
                if rec is not None:
                    got[rank] = rec
            if len(got) == WORLD_SIZE:
                return got, None
            now = time.monotonic()
            if failed_at is None and any(r.get("outcome") == "fail" for r in got.values()):
                failed_at = now
            missing = [r for r in range(WORLD_SIZE) if r not in got]
            for rank in missing:
                code = self.procs[rank].poll()
                if code is not None:
                    self._poll()  # the rank may have reported just before exiting
                    if self._find(rank, pred) is None:
                        return got, "rank %d died (exit code %s): %s" % (
                            rank, code, self.log_tail(rank))
            if failed_at is not None and now - failed_at > GRACE_AFTER_FAIL_S:
                return got, "rank(s) %s still running %.0f s after another rank failed" % (
                    ",".join(map(str, missing)), GRACE_AFTER_FAIL_S)
            if now - start > deadline_s:
                return got, "timed out after %.0f s (rank(s) %s did not finish)" % (
                    deadline_s, ",".join(map(str, missing)))
            time.sleep(0.02)

    def log_tail(self, rank, lines=8):
        try:
            with open(self.log_paths[rank], errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return ""

    def send(self, cmd):
        for p in self.procs:
            try:
                p.stdin.write(json.dumps(cmd) + "\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass  # a dead rank shows up in wait()

    def kill_children(self, index):
        """Ends test index's processes (a rank's child per test), after a
        stack dump to the rank logs. A pid is signalled only while it is
        still that rank's child, never a reused one."""
        pids = []
        for rank, p in enumerate(self.procs):
            rec = self._find(rank, lambda r: r.get("started") == index)
            if rec and _parent_of(rec["pid"]) == p.pid:
                pids.append(rec["pid"])
        for sig, pause in ((signal.SIGUSR1, 0.5), (signal.SIGKILL, 0)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(pause)

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()

    def close(self):
        self.send({"quit": True})
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def _parent_of(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _combine(test_id, ranks, problem, secs):
    """One outcome for the test from the ranks' reports: fail if any rank
    failed or the world broke, else skip if any skipped, else pass."""
    fails = {r: rec for r, rec in sorted(ranks.items()) if rec["outcome"] == "fail"}
    if fails or problem:
        cause = next(iter(fails.values()))["error"] if fails else problem
        outcome = "fail"
    elif any(rec["outcome"] == "skip" for rec in ranks.values()):
        outcome, cause = "skip", next(rec["error"] for rec in ranks.values()
                                      if rec["outcome"] == "skip")
    else:
        outcome, cause = "pass", ""
    return {"test": test_id, "outcome": outcome, "cause": cause, "problem": problem,
            "secs": round(secs, 2),
            "ranks": {str(r): {"error": rec["error"], "traceback": rec["traceback"]}
                      for r, rec in fails.items()}}


def list_tests():
    """(class, test) pairs of the suite classes, in unittest's order, read
    from the source (the coordinator does not import torch)."""
    import ast
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None:
        raise ImportError("torch is not installed")
    path = os.path.join(os.path.dirname(spec.origin),
                        "testing/_internal/distributed/rpc/rpc_test.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in scope.SUITE_CLASSES:
            names = sorted(n.name for n in node.body
                           if isinstance(n, ast.FunctionDef) and n.name.startswith("test"))
            out += [(node.name, n) for n in names]
    return out


def selected_tests(pattern=None, include_excluded=False):
    tests = []
    for cls, name in list_tests():
        if not include_excluded and scope.exclusion(name):
            continue
        if pattern and not re.search(pattern, "%s.%s" % (cls, name)):
            continue
        tests.append((cls, name))
    return tests


def run_suite(mode, tests, log_dir=None, echo=None):
    """Runs tests ((class, name) pairs) in mode; a list of result dicts."""
    assert mode in MODES
    log_dir = log_dir or tempfile.mkdtemp(prefix="torch_suite_%s_" % mode)
    store_dir = tempfile.mkdtemp(prefix="store_", dir=log_dir)
    results, world, worlds, start_failures = [], None, 0, 0
    try:
        for index, (cls, name) in enumerate(tests):
            test_id = "%s.%s" % (cls, name)
            t0 = time.monotonic()
            if world is None:
                world = World(mode, log_dir, worlds)
                worlds += 1
                _, problem = world.wait(lambda r: r.get("ready"), START_DEADLINE_S)
                if problem:
                    world.kill()
                    world = None
                    start_failures += 1
                    res = _combine(test_id, {}, "world did not start: " + problem, 0)
                    results.append(res)
                    if echo:
                        echo(res)
                    if start_failures >= 3:  # broken install: say so once per test, fast
                        for c, n in tests[index + 1:]:
                            results.append(_combine("%s.%s" % (c, n), {}, res["problem"], 0))
                        break
                    continue
                t0 = time.monotonic()
            release = os.path.join(store_dir, "%d.release" % index)
            world.send({"index": index, "cls": cls, "test": name, "port": free_port(),
                        "file": os.path.join(store_dir, "%d_%s" % (index, name)),
                        "release": release})
            ranks, problem = world.wait(lambda r, i=index: r.get("index") == i,
                                        scope.deadline(name))
            open(release, "w").close()
            res = _combine(test_id, ranks, problem, time.monotonic() - t0)
            results.append(res)
            if echo:
                echo(res)
            if problem is not None:
                world.kill_children(index)
                # The ranks report the killed children; a rank that does not
                # within a few seconds is broken: start a new world.
                _, stuck = world.wait(lambda r, i=index: r.get("index") == i, 10.0)
                if stuck or any(p.poll() is not None for p in world.procs):
                    world.kill()
                    world = None
    finally:
        if world is not None:
            world.close()
    return results


def summary(mode, results, secs=None):
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("pass", "fail", "skip")}
    ran = counts["pass"] + counts["fail"]
    rate = 100.0 * counts["pass"] / ran if ran else 0.0
    text = "%-8s %4d passed, %4d failed, %4d skipped of %4d in scope: pass rate %.1f%%" % (
        mode, counts["pass"], counts["fail"], counts["skip"], len(results), rate)
    if secs is not None:
        text += " (%.0f s)" % secs
    return text


def print_result(res):
    line = "%-4s %-62s %6.1fs" % (res["outcome"].upper(), res["test"], res["secs"])
    if res["outcome"] != "pass":
        line += "  " + res["cause"][:300]
    print(line, flush=True)


def _short_cause(cause):
    """A cause without the worker numbers that vary by rank."""
    cause = re.sub(r"worker\d+", "workerN", cause)
    cause = re.sub(r"\(id \d+\)", "(id N)", cause)
    return cause[:160]


def write_expected(mode, results_path):
    """Rewrites expected_fail.py's entry for mode from a --json results file."""
    sys.path.insert(0, HERE)
    from expected_fail import EXPECTED_FAIL
    with open(results_path) as f:
        data = json.load(f)
    assert data["mode"] == mode, "%s holds mode %s" % (results_path, data["mode"])
    table = dict(EXPECTED_FAIL)
    table[mode] = {r["test"].split(".", 1)[1]: _short_cause(r["cause"])
                   for r in data["results"]
                   if r["outcome"] == "fail" and not scope.exclusion(r["test"].split(".", 1)[1])}
    lines = ['"""Generated by `runner.py --write-expected MODE RESULTS.json`: the in-scope',
             'tests of PyTorch 1.13\'s rpc_test.py that fail against tensorplay today,',
             'per mode, with the first failing rank\'s error."""', "", "EXPECTED_FAIL = {"]
    for m in sorted(table):
        lines.append("    %r: {" % m)
        lines += ["        %r:\n            %r," % (t, c) for t, c in sorted(table[m].items())]
        lines.append("    },")
    lines.append("}")
    with open(os.path.join(HERE, "expected_fail.py"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=MODES, default="default")
    ap.add_argument("--tests", help="regex on Class.test_name")
    ap.add_argument("--include-excluded", action="store_true",
                    help="also run tests that scope.py excludes")
    ap.add_argument("--list", action="store_true", help="list the selected tests and exit")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--log-dir", help="rank logs and results (default: a new temp dir)")
    ap.add_argument("--write-expected", nargs=2, metavar=("MODE", "RESULTS_JSON"),
                    help="rewrite expected_fail.py's MODE entry from a --json file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.write_expected:
        return write_expected(*args.write_expected)
    tests = selected_tests(args.tests, args.include_excluded)
    if args.list:
        for cls, name in tests:
            print("%s.%s%s" % (cls, name, "  [excluded: %s]" % scope.exclusion(name)
                                if scope.exclusion(name) else ""))
        return 0
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="torch_suite_%s_" % args.mode)
    os.makedirs(log_dir, exist_ok=True)
    print("logs in %s" % log_dir, flush=True)
    t0 = time.monotonic()
    results = run_suite(args.mode, tests, log_dir, echo=print_result)
    secs = time.monotonic() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": args.mode, "secs": round(secs, 1), "results": results}, f,
                      indent=1)
    print(summary(args.mode, results, secs))
    return 0 if all(r["outcome"] != "fail" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
