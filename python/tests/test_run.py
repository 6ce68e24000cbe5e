"""The launcher python3 -m tensorplay.distributed.run (issue 20): torchrun's
environment for each rank, a fresh job secret per job, a failing rank stops
the others with its exit status, and a signal to the launcher ends every
process it started within the grace period, leaving none behind."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PYTHON = os.environ.get("PYTHON", sys.executable)
LAUNCHER = [PYTHON, "-m", "tensorplay.distributed.run"]
KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TP_SECRET"]


def env_without_secret():
    env = dict(os.environ)
    env.pop("TP_SECRET", None)
    return env


def launch(tmp_path, args, script=None, env=None, timeout=60):
    if script is not None:
        (tmp_path / "prog.py").write_text(textwrap.dedent(script))
    return subprocess.run(LAUNCHER + args, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env if env is not None else env_without_secret())


def by_rank(stdout):
    """{rank: [lines]} from "[rank] line" output."""
    out = {}
    for line in stdout.splitlines():
        assert line.startswith("["), line
        rank, _, rest = line[1:].partition("] ")
        out.setdefault(int(rank), []).append(rest)
    return out


def alive(pid):
    """Running (a zombie no longer counts: nothing of it runs)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_files(paths, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() and p.read_text().endswith("\n") for p in paths):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)


ENV_SCRIPT = """
import json, os, sys
print(json.dumps({k: os.environ.get(k) for k in %r}))
print("args", json.dumps(sys.argv[1:]))
""" % KEYS


@pytest.mark.parametrize("flag", ["--nproc-per-node", "--nproc_per_node"])
def test_env_per_rank(tmp_path, flag):
    p = launch(tmp_path, [flag, "3", "prog.py", "--lr", "0.1"], ENV_SCRIPT)
    assert p.returncode == 0, p.stdout + p.stderr
    out = by_rank(p.stdout)
    assert sorted(out) == [0, 1, 2]
    envs = {r: json.loads(lines[0]) for r, lines in out.items()}
    for r, e in envs.items():
        assert out[r][1] == 'args ["--lr", "0.1"]'
        assert e["RANK"] == e["LOCAL_RANK"] == e["ROLE_RANK"] == str(r)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == "3"
        assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_NAME"]) == ("0", "1", "default")
        assert e["MASTER_ADDR"] == "127.0.0.1" and 0 < int(e["MASTER_PORT"]) < 65536
        assert (e["TORCHELASTIC_RUN_ID"], e["TORCHELASTIC_RESTART_COUNT"],
                e["TORCHELASTIC_MAX_RESTARTS"]) == ("none", "0", "0")
        assert len(e["TP_SECRET"]) == 64 and int(e["TP_SECRET"], 16) >= 0
    # One job: one rendezvous address and one secret for every rank.
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    assert len({e["TP_SECRET"] for e in envs.values()}) == 1


def test_master_flags_and_pet_defaults(tmp_path):
    env = env_without_secret()
    env["PET_NPROC_PER_NODE"] = "2"  # torchrun reads its flags' defaults from PET_*
    p = launch(tmp_path, ["--master_addr", "localhost", "--master-port", "29517", "--role",
                          "trainer", "--rdzv-id", "job7", "--standalone", "prog.py"],
               ENV_SCRIPT, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    envs = [json.loads(lines[0]) for lines in by_rank(p.stdout).values()]
    assert len(envs) == 2
    for e in envs:
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("localhost", "29517")
        assert (e["ROLE_NAME"], e["TORCHELASTIC_RUN_ID"]) == ("trainer", "job7")


def test_secret_is_fresh_per_job_unless_set(tmp_path):
    secrets = set()
    for _ in range(2):
        p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], ENV_SCRIPT)
        assert p.returncode == 0, p.stderr
        secrets.add(json.loads(by_rank(p.stdout)[0][0])["TP_SECRET"])
    assert len(secrets) == 2
    # As tprun: a secret already in the environment is the job's (another launcher's).
    env = env_without_secret()
    env["TP_SECRET"] = "ab" * 32
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], env=env)
    assert json.loads(by_rank(p.stdout)[0][0])["TP_SECRET"] == "ab" * 32
    # It never appears on a command line.
    assert all(s not in " ".join(LAUNCHER) for s in secrets)


def test_module_mode_and_no_python(tmp_path):
    (tmp_path / "mymod.py").write_text("import os\nprint('module', os.environ['RANK'])\n")
    p = launch(tmp_path, ["--nproc-per-node", "2", "-m", "mymod"])
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] module 0", "[1] module 1"]
    p = launch(tmp_path, ["--nproc-per-node", "2", "--no-python", "--no-prefix", "sh", "-c",
                          'echo "sh $RANK $WORLD_SIZE"'])
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["sh 0 2", "sh 1 2"]
    p = launch(tmp_path, ["--nproc-per-node", "1", "--no-python", "./no-such-program"])
    assert p.returncode == 127 and "no-such-program" in p.stderr


@pytest.mark.parametrize("args, words", [
    (["--nnodes", "2"], "--nnodes 2: multi-machine"),
    (["--nnodes", "1:4"], "--nnodes 1:4: multi-machine"),
    (["--node-rank", "1"], "--node-rank 1"),
    (["--max-restarts", "3"], "--max-restarts 3"),
    (["--nproc-per-node", "0"], "--nproc-per-node 0"),
    (["--nproc-per-node", "gpu"], "no GPUs"),
])
def test_unsupported_is_a_clear_error(tmp_path, args, words):
    p = launch(tmp_path, args + ["prog.py"], ENV_SCRIPT)
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert p.stdout == ""


def test_single_node_spellings_accepted(tmp_path):
    p = launch(tmp_path, ["--nnodes", "1:1", "--node_rank", "0", "--max_restarts", "0",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                          "--nproc-per-node", "1", "prog.py"], ENV_SCRIPT)
    assert p.returncode == 0, p.stderr


FAIL_SCRIPT = """
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
here = pathlib.Path(sys.argv[1])
(here / ("pid.%d" % rank)).write_text("%d\\n" % os.getpid())
if rank == 1:
    while len(list(here.glob("pid.*"))) < 3:
        time.sleep(0.02)
    time.sleep(0.2)
    print("rank 1 fails", flush=True)
    sys.exit(3)
time.sleep(60)
"""


def test_failing_rank_stops_the_others_with_its_status(tmp_path):
    start = time.monotonic()
    p = launch(tmp_path, ["--nproc-per-node", "3", "prog.py", str(tmp_path)], FAIL_SCRIPT)
    took = time.monotonic() - start
    assert p.returncode == 3, p.stdout + p.stderr
    assert took < 15, took  # not the 60 s the others sleep
    assert "[1] rank 1 fails" in p.stdout.splitlines()
    assert "rank 1 exited with status 3; stopping the others" in p.stderr
    pids = [int((tmp_path / ("pid.%d" % r)).read_text()) for r in range(3)]
    assert not any(alive(pid) for pid in pids)


def test_rank_killed_by_a_signal_is_128_plus_signal(tmp_path):
    p = launch(tmp_path, ["--nproc-per-node", "2", "prog.py"], """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    assert p.returncode == 128 + signal.SIGKILL, p.stderr
    assert "rank 0 was killed by signal 9" in p.stderr


# Each rank starts a grandchild of its own; rank 1 ignores SIGINT and SIGTERM,
# so only the SIGKILL after the grace period ends it.
STUBBORN_SCRIPT = """
import os, pathlib, signal, subprocess, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "300"])
(pathlib.Path(sys.argv[1]) / ("pid.%d" % rank)).write_text("%d %d\\n" % (os.getpid(), child.pid))
while True:
    time.sleep(1)
"""


def start_stubborn(tmp_path, nproc=2):
    (tmp_path / "prog.py").write_text(STUBBORN_SCRIPT)
    proc = subprocess.Popen(LAUNCHER + ["--nproc-per-node", str(nproc), "--grace", "1",
                                        "prog.py", str(tmp_path)],
                            cwd=tmp_path, env=env_without_secret(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    files = [tmp_path / ("pid.%d" % r) for r in range(nproc)]
    try:
        wait_files(files)
    except BaseException:
        proc.kill()
        raise
    pids = [int(x) for f in files for x in f.read_text().split()]
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_ends_every_process(tmp_path, sig):
    proc, pids = start_stubborn(tmp_path)
    assert all(alive(pid) for pid in pids)
    start = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    took = time.monotonic() - start
    assert proc.returncode == 128 + sig, err
    assert took < 5, took  # the grace period (1 s), then SIGKILL
    assert "got signal %d; stopping every rank" % sig in err
    deadline = time.monotonic() + 2
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if alive(pid)] == []  # ranks and their children


def test_second_signal_kills_at_once(tmp_path):
    (tmp_path / "prog.py").write_text(STUBBORN_SCRIPT)
    proc = subprocess.Popen(LAUNCHER + ["--nproc-per-node", "2", "--grace", "60", "prog.py",
                                        str(tmp_path)],
                            cwd=tmp_path, env=env_without_secret(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_files([tmp_path / "pid.0", tmp_path / "pid.1"])
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # rank 1 ignored the first; no 60 s wait
        proc.communicate(timeout=10)
        assert time.monotonic() - start < 5
        assert proc.returncode == 128 + signal.SIGINT
    finally:
        proc.kill()


def test_launcher_killed_outright_takes_its_ranks(tmp_path):
    proc, pids = start_stubborn(tmp_path)
    ranks = pids[0::2]
    proc.kill()  # SIGKILL: no chance to forward anything
    proc.communicate(timeout=10)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    for pid in pids[1::2]:  # the grandchildren: PR_SET_PDEATHSIG covers ranks only
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert [pid for pid in ranks if pid in left] == []


def test_lines_are_prefixed_and_split_by_stream(tmp_path):
    p = launch(tmp_path, ["--nproc-per-node", "2", "prog.py"], """
        import os, sys
        r = os.environ["RANK"]
        print("out", r)
        print("err", r, file=sys.stderr)
        sys.stdout.write("no newline " + r)
    """)
    assert p.returncode == 0
    assert sorted(p.stdout.splitlines()) == ["[0] no newline 0", "[0] out 0",
                                             "[1] no newline 1", "[1] out 1"]
    assert sorted(l for l in p.stderr.splitlines() if l.startswith("[")) == ["[0] err 0",
                                                                            "[1] err 1"]


def test_output_a_child_writes_after_its_rank_exits_is_kept(tmp_path):
    """Once every rank exited the launcher still copies what their own
    children write to the pipes they inherited (for up to DRAIN_S, 1 s),
    rather than stopping while a pipe is open: here a child writes 0.5 s
    after its rank exited."""
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], """
        import os, time
        print("rank exits", flush=True)
        rank_pid = os.getpid()
        if os.fork() == 0:
            deadline = time.monotonic() + 10
            while os.getppid() == rank_pid and time.monotonic() < deadline:
                time.sleep(0.01)  # until the rank is gone
            time.sleep(0.5)
            os.write(1, b"child writes after\\n")
            os._exit(0)
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["[0] rank exits", "[0] child writes after"], p.stdout


def test_seed_example_through_the_launcher(tmp_path):
    seed = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "seed.py")
    p = launch(tmp_path, ["--nproc-per-node", "2", os.path.abspath(seed)], timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "[0] 7\n"
