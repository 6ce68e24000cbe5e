"""The launcher python3 -m tensorplay.distributed.run (issue 20): torchrun's
environment for each rank, a fresh job secret per job, a failing rank stops
the others with its exit status, and a signal to the launcher ends every
process it started within the grace period, leaving none behind. Issue 22
(spec/launch.md): several nodes (two launchers on this machine as nodes 0
and 1 of one job), the job secret from a 0600 file, and restarts of a failed
process that rejoins the running job as a new incarnation."""
import json
import os
import re
import socket
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


def _ephemeral_low():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


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
        # Below the ephemeral range, where no outgoing connection takes it
        # before rank 0 binds it.
        low = _ephemeral_low()
        assert low <= 11000 or 10000 <= int(e["MASTER_PORT"]) < low, (e["MASTER_PORT"], low)
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


def test_valued_flags_default_to_their_pet_variables(tmp_path):
    """Every valued flag, not only --nproc-per-node, takes its default from
    PET_<NAME> as torchrun's do: the values reach each rank's environment."""
    env = env_without_secret()
    env.update(PET_NPROC_PER_NODE="1", PET_MASTER_ADDR="localhost", PET_MASTER_PORT="29519",
               PET_RDZV_ID="job9", PET_ROLE="r9", PET_MAX_RESTARTS="2")
    p = launch(tmp_path, ["prog.py"], ENV_SCRIPT, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    e = json.loads(by_rank(p.stdout)[0][0])
    assert (e["MASTER_ADDR"], e["MASTER_PORT"], e["TORCHELASTIC_RUN_ID"], e["ROLE_NAME"],
            e["TORCHELASTIC_MAX_RESTARTS"]) == ("localhost", "29519", "job9", "r9", "2")
    # A flag given on the command line wins over its variable.
    p = launch(tmp_path, ["--role", "cli", "prog.py"], ENV_SCRIPT, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(by_rank(p.stdout)[0][0])["ROLE_NAME"] == "cli"


def test_a_signal_wakes_the_launchers_loop():
    """SIGINT or SIGTERM reaches the launcher while it waits in select for its
    ranks' output (up to --monitor-interval, 1 s at most): the handler wakes
    that wait at once through the self-pipe, so the ranks are told to stop
    without waiting for the interval to run out."""
    from tensorplay.distributed import run as launcher
    spec = launcher.JobSpec(launcher.make_parser().parse_args(["--nproc", "1", "prog.py"]))
    job = launcher.Job(spec, 5.0, True, 1.0)
    try:
        assert job.sel.select(0) == []  # nothing to read yet
        # Both ends non-blocking: a burst of signals that fills the pipe
        # before the loop drains it never blocks the handler.
        assert not os.get_blocking(job.wake_r) and not os.get_blocking(job.wake_w)
        job._on_signal(signal.SIGTERM, None)
        assert job.got_signal == signal.SIGTERM
        # The byte is in the pipe already: a wait of 0 sees it.
        assert [key.data for key, _ in job.sel.select(0)] == [None]  # the wake-up pipe
        assert job.pump(0) is False  # drains it: no rank's pipe is open
        assert job.sel.select(0) == []
    finally:
        job.sel.close()
        os.close(job.wake_r)
        os.close(job.wake_w)


# spec: LAUNCH-1
def test_on_off_flags_default_to_their_pet_variables(tmp_path, monkeypatch):
    """As torchrun's check_env: an on/off flag is on when PET_<FLAG> holds an
    integer other than 0, off when it holds 0 or is unset, and the command
    line turns it on whatever the variable says."""
    from tensorplay.distributed import run as launcher
    flags = {"standalone": "--standalone", "no_prefix": "--no-prefix", "module": "-m",
             "no_python": "--no-python", "restart_rank0": "--restart-rank0"}
    for dest, flag in flags.items():
        var = "PET_" + dest.upper()
        for value, on in (("1", True), ("2", True), ("0", False), (None, False)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
            assert getattr(launcher.make_parser().parse_args(["prog.py"]), dest) is on, var
        assert getattr(launcher.make_parser().parse_args([flag, "prog.py"]), dest) is True
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PET_STANDALONE", "yes")
    with pytest.raises(launcher.UsageError, match="PET_STANDALONE='yes': expected an integer"):
        launcher.make_parser()
    monkeypatch.delenv("PET_STANDALONE")
    # Through the launcher: PET_NO_PREFIX=1 is --no-prefix; a value that is
    # not an integer is a usage error that starts nothing.
    env = env_without_secret()
    env["PET_NO_PREFIX"] = "1"
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], "print('hi')\n", env=env)
    assert (p.returncode, p.stdout) == (0, "hi\n"), p.stderr
    env["PET_NO_PREFIX"] = "on"
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], "print('hi')\n", env=env)
    assert (p.returncode, p.stdout) == (2, ""), p.stderr
    assert "PET_NO_PREFIX='on': expected an integer" in p.stderr


def test_secret_is_fresh_per_job_unless_set(tmp_path):
    secrets = set()
    for _ in range(2):
        p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], ENV_SCRIPT)
        assert p.returncode == 0, p.stderr
        secrets.add(json.loads(by_rank(p.stdout)[0][0])["TP_SECRET"])
    assert len(secrets) == 2
    # LAUNCH-5: 32 bytes from the kernel's generator, as 64 hex digits.
    assert all(re.fullmatch("[0-9a-f]{64}", s) for s in secrets), secrets
    # As tprun: a secret already in the environment is the job's (another launcher's).
    env = env_without_secret()
    env["TP_SECRET"] = "ab" * 32
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], env=env)
    assert json.loads(by_rank(p.stdout)[0][0])["TP_SECRET"] == "ab" * 32
    # It never appears on a command line.
    assert all(s not in " ".join(LAUNCHER) for s in secrets)


def test_output_lines_at_the_length_limit(tmp_path):
    """A worker's line of exactly 16384 bytes (LINE_MAX_BYTES, tprun's too)
    comes out as one prefixed line, whole; one byte more is split in two
    (16384 and 1), with nothing empty between."""
    script = "import sys\nsys.stdout.write('a' * 16384 + '\\n' + 'b' * 16385 + '\\n')\n"
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], script)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[0] " + "a" * 16384, "[0] " + "b" * 16384, "[0] b"]
    # No newline at all: cut at the limit as it arrives, the rest at the end.
    script = "import sys\nsys.stdout.write('c' * 40000)\n"
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], script)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[0] " + "c" * 16384] * 2 + ["[0] " + "c" * 7232]


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
    assert p.returncode == 127
    assert "cannot run './no-such-program': No such file or directory\n" in p.stderr, p.stderr
    # Found but not runnable: 126, as a shell says (and as tprun).
    (tmp_path / "noexec.sh").write_text("echo hi\n")
    (tmp_path / "noexec.sh").chmod(0o644)
    p = launch(tmp_path, ["--nproc-per-node", "1", "--no-python", "./noexec.sh"])
    assert p.returncode == 126 and "noexec.sh" in p.stderr and "Permission denied" in p.stderr


# spec: LAUNCH-1..3, LAUNCH-6
@pytest.mark.parametrize("args, words", [
    (["--nnodes", "2", "--master-port", "29517"], "--nnodes 2 needs --master-addr"),
    (["--nnodes", "2", "--master-addr", "127.0.0.1"], "--nnodes 2 needs --master-port"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:0"], "--nnodes 2 needs --master-port"),
    (["--nnodes", "1:4"], "--nnodes 1:4: elastic membership (MIN < MAX) is not supported"),
    (["--node-rank", "1"], "--node-rank 1 is out of range for --nnodes 1 (0..0)"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29517"],
     "--node-rank 2 is out of range for --nnodes 2 (0..1)"),
    (["--rdzv-endpoint", "127.0.0.1:29517", "--master-port", "29517"], "not both"),
    (["--standalone", "--nnodes", "2"], "--standalone is one machine"),
    (["--max-restarts", "-1"], "--max-restarts -1"),
    (["--nproc-per-node", "0"], "--nproc-per-node 0"),
    (["--nproc-per-node", "gpu"], "no GPUs"),
    (["--master-port", "0"], "--master-port 0: expected 1..65535"),
    (["--master-port", "65536"], "--master-port 65536: expected 1..65535"),
    (["--grace", "-1"], "--grace -1: expected 0..3600 seconds"),
    (["--grace", "3601"], "--grace 3601: expected 0..3600 seconds"),
    (["--no-python", "-m"], "-m and --no-python exclude each other"),
    (["--secret-file", "/no/such/secret"], "--secret-file /no/such/secret: No such file"),
])
def test_unsupported_is_a_clear_error(tmp_path, args, words):
    p = launch(tmp_path, args + ["prog.py"], ENV_SCRIPT)
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert p.stdout == ""


# spec: LAUNCH-1
def test_argument_bounds_both_sides():
    """The launcher's numeric arguments at their bounds: the last value in
    range is taken and the first past it refused, by name."""
    from tensorplay.distributed import run as launcher
    cpus = os.cpu_count() or 1
    for word in ("cpu", "auto"):
        assert launcher._nproc(word) == min(cpus, launcher.NPROC_MAX)
    assert launcher._nproc(str(launcher.NPROC_MAX)) == launcher.NPROC_MAX
    big = launcher.WORLD_SIZE_MAX
    for value in (str(big), "%d:%d" % (big, big)):
        assert launcher._nnodes(value) == big
    for value in (str(big + 1), "%d:%d" % (big + 1, big + 1), "%d:%d" % (big, big + 1)):
        with pytest.raises(launcher.UsageError, match="expected 1..%d" % big):
            launcher._nnodes(value)
    assert launcher._endpoint("node7:65535") == ("node7", 65535)
    assert launcher._endpoint("[::1]:65535") == ("::1", 65535)
    # No port: a bare host name, a bare IPv6 address, brackets alone, or port 0.
    for value, host in (("node7", "node7"), ("::1", "::1"), ("fe80::1:2", "fe80::1:2"),
                        ("[::1]", "::1"), ("node7:0", "node7")):
        assert launcher._endpoint(value) == (host, None)
    for value in ("node7:65536", "[::1]:65536"):
        with pytest.raises(launcher.UsageError, match="the port must be 0..65535"):
            launcher._endpoint(value)

    def spec(*args):
        return launcher.JobSpec(launcher.make_parser().parse_args(list(args) + ["prog.py"]))
    for port in (1, 65535):
        assert spec("--master-port", str(port)).master_port == port
    for grace in ("0", "3600"):
        spec("--grace", grace)  # accepted (0: SIGKILL at once)
    assert spec("--max-restarts", str(launcher.RESTARTS_MAX)).max_restarts == launcher.RESTARTS_MAX
    # The first values past the bounds, as numbers written here: a bound
    # moved by one would be taken above.
    with pytest.raises(launcher.UsageError, match=r"--max-restarts 10001: expected 0\.\.10000"):
        spec("--max-restarts", "10001")
    with pytest.raises(launcher.UsageError, match=r"--nproc-per-node 1025: expected 1\.\.1024"):
        launcher._nproc("1025")
    two = ["--master-addr", "127.0.0.1", "--master-port", "29500", "--nproc-per-node", "1024"]
    assert spec("--nnodes", str(big // 1024), *two).world_size == big
    with pytest.raises(launcher.UsageError, match="--nnodes 65 x --nproc-per-node 1024 is over "
                       "65536 processes"):
        spec("--nnodes", str(big // 1024 + 1), *two)
    assert spec("-m").cmd[-2:] == ["-m", "prog.py"]
    assert spec("--no-python").cmd == ["prog.py"]


def test_single_node_spellings_accepted(tmp_path):
    p = launch(tmp_path, ["--nnodes", "1:1", "--node_rank", "0", "--max_restarts", "0",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                          "--rdzv-conf", "join_timeout=900,read_timeout=60",
                          "--start_method", "fork", "--monitor-interval", "0.05",
                          "--nproc-per-node", "1", "prog.py"], ENV_SCRIPT)
    assert p.returncode == 0, p.stderr
    e = json.loads(by_rank(p.stdout)[0][0])
    assert e["MASTER_ADDR"] == "localhost" and int(e["MASTER_PORT"]) > 0  # port 0: a free one


# spec: LAUNCH-1, LAUNCH-3
def test_rdzv_endpoint_in_brackets(tmp_path):
    """--rdzv-endpoint [V6]:PORT: the address inside the brackets, the port
    after them; a bracket left open, or anything but :PORT after it, is a
    clear usage error."""
    p = launch(tmp_path, ["--rdzv-endpoint", "[::1]:29517", "prog.py"], ENV_SCRIPT)
    assert p.returncode == 0, p.stderr
    e = json.loads(by_rank(p.stdout)[0][0])
    assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("::1", "29517")
    for bad in ("[::1", "[::1]29517", "[]:29517"):
        p = launch(tmp_path, ["--rdzv-endpoint", bad, "prog.py"])
        assert p.returncode == 2 and "--rdzv-endpoint %r: expected HOST:PORT" % bad in p.stderr, \
            p.stderr
        assert p.stdout == ""


# --- several nodes (spec/launch.md) ---

def free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secret_file(tmp_path, mode=0o600, text=None):
    """A secret file (the secret, the path)."""
    secret = text if text is not None else os.urandom(32).hex()
    path = tmp_path / "job.secret"
    path.write_text(secret + "\n")
    path.chmod(mode)
    return secret, str(path)


# spec: LAUNCH-2, LAUNCH-4, LAUNCH-5
@pytest.mark.parametrize("how", [
    ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
     "127.0.0.1", "--master-port", "29517"],
    ["--nnodes=2:2", "--node_rank=1", "--nproc", "2", "--rdzv-endpoint", "127.0.0.1:29517"],
])
def test_env_of_node_1_of_2(tmp_path, how):
    secret, path = secret_file(tmp_path)
    p = launch(tmp_path, how + ["--secret-file", path, "prog.py"], ENV_SCRIPT)
    assert p.returncode == 0, p.stderr
    out = by_rank(p.stdout)
    assert sorted(out) == [2, 3]
    for r, lines in out.items():
        e = json.loads(lines[0])
        assert (e["RANK"], e["LOCAL_RANK"], e["ROLE_RANK"]) == (str(r), str(r - 2), str(r))
        assert e["WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert (e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) == ("1", "2")
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("127.0.0.1", "29517")
        assert e["TP_SECRET"] == secret
    assert secret not in p.stderr


# spec: LAUNCH-5
def test_secret_file_rules(tmp_path):
    node1 = ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
             "--rdzv-endpoint", "127.0.0.1:29517"]
    # Readable by others: refused, naming the mode, never showing the secret.
    secret, path = secret_file(tmp_path, 0o644)
    p = launch(tmp_path, node1 + ["--secret-file", path, "prog.py"], ENV_SCRIPT)
    assert p.returncode == 2 and "has mode 0644" in p.stderr and "chmod 600" in p.stderr
    assert secret not in p.stdout + p.stderr and p.stdout == ""
    # Not hex (or too short): refused, the content not shown.
    secret, path = secret_file(tmp_path, 0o600, "not-a-secret-" + "z" * 40)
    p = launch(tmp_path, ["--secret-file", path, "prog.py"], ENV_SCRIPT)
    assert p.returncode == 2 and "does not hold a job secret" in p.stderr
    assert secret not in p.stderr and p.stdout == ""
    # A directory: refused.
    p = launch(tmp_path, ["--secret-file", str(tmp_path), "prog.py"], ENV_SCRIPT)
    assert p.returncode == 2 and "not a regular file" in p.stderr
    if os.geteuid() == 0:  # another user's file, mode 0600: refused, whoever may read it
        secret = os.urandom(32).hex()
        path = str(tmp_path / "other.secret")
        with open(path, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)
        os.chown(path, 65534, -1)
        p = launch(tmp_path, ["--secret-file", path, "prog.py"], ENV_SCRIPT)
        assert p.returncode == 2 and "it is not owned by you" in p.stderr, p.stderr
        assert secret not in p.stderr and p.stdout == ""
    # Several nodes and no secret: each would invent its own; refused.
    p = launch(tmp_path, node1 + ["prog.py"], ENV_SCRIPT)
    assert p.returncode == 2 and "--nnodes 2 needs the job secret" in p.stderr
    # TP_SECRET in the environment serves several nodes; a secret file wins over it.
    env = env_without_secret()
    env["TP_SECRET"] = "cd" * 32
    p = launch(tmp_path, node1 + ["prog.py"], env=env)
    assert p.returncode == 0 and json.loads(by_rank(p.stdout)[1][0])["TP_SECRET"] == "cd" * 32
    secret, path = secret_file(tmp_path, 0o400)
    p = launch(tmp_path, node1 + ["--secret-file", path, "prog.py"], env=env)
    assert p.returncode == 0 and json.loads(by_rank(p.stdout)[1][0])["TP_SECRET"] == secret


def test_secret_file_holds_16_to_128_bytes_as_hex(tmp_path):
    """LAUNCH-5, TCP-17: 32 to 256 hex digits, an even number; one digit
    fewer or more is refused with the rule."""
    from tensorplay.distributed import run as launcher
    for digits, ok in ((30, False), (31, False), (32, True), (33, False), (254, True),
                       (256, True), (257, False), (258, False)):
        text = ("ab" * 129)[:digits]
        _, path = secret_file(tmp_path, 0o600, text)
        if ok:
            assert launcher.secret_from_file(path) == text, digits
        else:
            with pytest.raises(launcher.SecretError, match="must be 32 to 256 hex digits"):
                launcher.secret_from_file(path)
    # Read up to SECRET_FILE_MAX bytes, as tprun: a secret ending at byte 4096
    # is whole; one byte more of padding cuts its last digit.
    secret = "ab" * 32
    for size, ok in ((4096, True), (4097, False)):  # tprun's limit too: one rule for both
        path = tmp_path / ("padded%d" % size)
        path.write_text(" " * (size - len(secret)) + secret)
        path.chmod(0o600)
        assert path.stat().st_size == size
        if ok:
            assert launcher.secret_from_file(str(path)) == secret
        else:
            with pytest.raises(launcher.SecretError, match="63 characters found"):
                launcher.secret_from_file(str(path))


def test_secret_file_read_keeps_no_descriptor(tmp_path):
    """LAUNCH-5: reading the secret file closes its descriptor, whether the
    file holds a secret or not (the launcher lives as long as the job)."""
    from tensorplay.distributed import run as launcher
    _, good = secret_file(tmp_path, 0o600, "ab" * 16)
    bad = str(tmp_path / "bad")
    with open(bad, "w") as f:
        f.write("not hex")
    os.chmod(bad, 0o600)
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert launcher.secret_from_file(good) == "ab" * 16
        with pytest.raises(launcher.SecretError, match="does not hold a job secret"):
            launcher.secret_from_file(bad)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_free_port_draws_below_the_ephemeral_range_when_it_has_room(monkeypatch):
    """free_port draws below the kernel's ephemeral range when more than 1000
    ports lie between FREE_PORT_LOW and it, and takes the kernel's choice
    (inside the range) otherwise: both sides of that bound."""
    from tensorplay.distributed import run as launcher
    kernel_low = _ephemeral_low()
    if kernel_low <= launcher.FREE_PORT_LOW + 1001:
        pytest.skip("this machine's ephemeral range starts at %d" % kernel_low)
    room = launcher.FREE_PORT_LOW + 1001
    monkeypatch.setattr(launcher, "_ephemeral_low", lambda: room)
    for _ in range(20):
        assert launcher.FREE_PORT_LOW <= launcher.free_port("127.0.0.1") < room
    monkeypatch.setattr(launcher, "_ephemeral_low", lambda: room - 1)
    for _ in range(20):
        assert launcher.free_port("127.0.0.1") >= kernel_low



def test_free_port_skips_a_port_in_use_and_tries_64_times(monkeypatch):
    """Each draw is bound before it is returned: a port some socket holds is
    skipped for the next draw. Draws are 10000 + randbelow(low - 10000), 64
    of them, before the kernel's choice."""
    from tensorplay.distributed import run as launcher
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]
    draws = []

    def draw(n):
        draws.append(n)
        return taken - 10000 if len(draws) == 1 else 12345 - 10000 + len(draws)
    try:
        if taken < 10000:
            pytest.skip("the kernel gave port %d" % taken)
        monkeypatch.setattr(launcher, "_ephemeral_low", lambda: 65000)
        monkeypatch.setattr(launcher.secrets, "randbelow", draw)
        port = launcher.free_port("127.0.0.1")
        assert port != taken and len(draws) >= 2 and draws[0] == 65000 - 10000
        draws.clear()
        monkeypatch.setattr(launcher.secrets, "randbelow",
                            lambda n: (draws.append(n), taken - 10000)[1])
        port = launcher.free_port("127.0.0.1")  # every draw taken: the kernel's choice
        assert port != taken and draws == [55000] * 64
    finally:
        held.close()


def test_ephemeral_low_without_proc_is_linuxs_default(monkeypatch):
    """_ephemeral_low reads the kernel's range; where /proc cannot be read
    or parsed it assumes Linux's default range's start, 32768 (below it
    free_port's draws stay out of the default range)."""
    from tensorplay.distributed import run as launcher
    import io
    assert launcher._ephemeral_low() == _ephemeral_low()

    def unreadable(path, *a, **k):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(launcher, "open", unreadable, raising=False)
    assert launcher._ephemeral_low() == 32768
    monkeypatch.setattr(launcher, "open", lambda *a, **k: io.StringIO("junk"), raising=False)
    assert launcher._ephemeral_low() == 32768

# Every rank calls every other one and says who answered (rank, node); no
# secret on any process's command line.
NODES_SCRIPT = """
import os
import tensorplay.distributed.rpc as rpc

def who():
    return [int(os.environ["RANK"]), int(os.environ["GROUP_RANK"])]

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
rpc.init_rpc("w%d" % rank, rank=rank, world_size=world)
answers = [rpc.rpc_sync("w%d" % q, who, timeout=30) for q in range(world)]
for pid in (os.getpid(), os.getppid()):
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        assert os.environ["TP_SECRET"].encode() not in f.read()
print("rank", rank, "heard", answers, flush=True)
rpc.shutdown()
"""


# spec: LAUNCH-2..5
def test_two_launchers_as_two_nodes(tmp_path):
    (tmp_path / "prog.py").write_text(NODES_SCRIPT)
    secret, path = secret_file(tmp_path)
    port = free_tcp_port()
    node = lambda k: LAUNCHER + ["--nnodes", "2", "--node-rank", str(k), "--nproc-per-node",
                                 "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                 "--secret-file", path, "--grace", "1", "prog.py"]
    n1 = subprocess.Popen(node(1), cwd=tmp_path, env=env_without_secret(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        n0 = subprocess.run(node(0), cwd=tmp_path, env=env_without_secret(), text=True,
                            capture_output=True, timeout=90)
        out1, err1 = n1.communicate(timeout=30)
    finally:
        n1.kill()
    assert n0.returncode == 0, n0.stdout + n0.stderr
    assert n1.returncode == 0, out1 + err1
    heard = "heard [[0, 0], [1, 0], [2, 1], [3, 1]]"
    assert sorted(n0.stdout.splitlines()) == ["[%d] rank %d %s" % (r, r, heard) for r in (0, 1)]
    assert sorted(out1.splitlines()) == ["[%d] rank %d %s" % (r, r, heard) for r in (2, 3)]
    assert secret not in n0.stdout + n0.stderr + out1 + err1


# spec: LAUNCH-2, LAUNCH-9: the launchers do not check that nodes agree on
# --nproc-per-node; the rendezvous does (INIT-4), failing the job on both.
def test_nodes_with_different_nproc_fail_at_the_rendezvous(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os
        import tensorplay.distributed.rpc as rpc
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        rpc.init_rpc("w%d" % rank, rank=rank, world_size=world,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_timeout=20))
        print("joined", flush=True)
        rpc.shutdown()
    """))
    secret, path = secret_file(tmp_path)
    port = free_tcp_port()
    node = lambda k, nproc: LAUNCHER + [
        "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", str(nproc),
        "--rdzv-endpoint", "127.0.0.1:%d" % port, "--secret-file", path, "--grace", "1",
        "prog.py"]
    n1 = subprocess.Popen(node(1, 1), cwd=tmp_path, env=env_without_secret(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        n0 = subprocess.run(node(0, 2), cwd=tmp_path, env=env_without_secret(), text=True,
                            capture_output=True, timeout=60)
        out1, err1 = n1.communicate(timeout=60)
    finally:
        n1.kill()
    assert n0.returncode != 0 and n1.returncode != 0, n0.stderr + err1
    assert "joined" not in n0.stdout + out1
    assert "world size mismatch" in n0.stderr + err1, n0.stderr + err1


# --- restarts (spec/launch.md LAUNCH-6, LAUNCH-7) ---

# The victim rank's first process kills itself (SIGKILL) after init, once (a
# marker file); the next rank calls it, retrying on peer-down, until an
# answer comes from its restart. argv: folder, victim, store (env or file).
ELASTIC_SCRIPT = """
import os, signal, sys, time
import tensorplay.distributed.rpc as rpc

def who():
    return [int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.environ.get("TP_REJOIN", "")]

here, victim, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
opts = rpc.TensorPipeRpcBackendOptions(
    init_method="env://" if store == "env" else "file://" + os.path.join(here, "store"))
rpc.init_rpc("w%d" % rank, rank=rank, world_size=world, rpc_backend_options=opts)
marker = os.path.join(here, "killed")
if rank == victim and not os.path.exists(marker):
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
if rank == (victim + 1) % world:
    deadline, answer = time.monotonic() + 30, None
    while time.monotonic() < deadline and (answer is None or answer[0] != 1):
        try:
            answer = rpc.rpc_sync("w%d" % victim, who, timeout=5)
        except RuntimeError:  # peer-down until the new incarnation rejoined
            time.sleep(0.05)
    print("answer", answer, flush=True)
rpc.shutdown()
"""


def launch_elastic(tmp_path, args, victim=1, store="env"):
    return launch(tmp_path, ["--nproc-per-node", "2", "--grace", "1"] + args +
                  ["prog.py", str(tmp_path), str(victim), store], ELASTIC_SCRIPT, timeout=90)


# spec: LAUNCH-6
def test_killed_worker_restarts_and_serves_again(tmp_path):
    p = launch_elastic(tmp_path, ["--max-restarts", "1"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["[0] answer [1, '1']"], p.stdout
    restarts = [l for l in p.stderr.splitlines() if "restarting" in l]
    assert restarts == ["tensorplay.distributed.run: rank 1 was killed by signal 9; restarting "
                        "it as a new incarnation (TP_REJOIN=1), restart 1 of 1"], p.stderr


# spec: LAUNCH-6
def test_no_restarts_the_job_fails_with_the_signal(tmp_path):
    p = launch_elastic(tmp_path, ["--max-restarts", "0"])
    assert p.returncode == 128 + signal.SIGKILL, p.stdout + p.stderr
    assert "rank 1 was killed by signal 9; stopping the others" in p.stderr


# spec: LAUNCH-6: each rank at most R times; the last failure's status; exit 0 never restarted.
def test_restarts_are_bounded_per_rank(tmp_path):
    p = launch(tmp_path, ["--nproc-per-node", "3", "--max-restarts", "2", "--grace", "1",
                          "prog.py"], """
        import os, sys, time
        print("count", os.environ["TORCHELASTIC_RESTART_COUNT"],
              os.environ.get("TP_REJOIN", "unset"), flush=True)
        if os.environ["RANK"] == "1":
            sys.exit(3)
        if os.environ["RANK"] == "0":
            time.sleep(60)
    """, env=dict(env_without_secret(), TP_REJOIN="1"))  # a stray one is not passed on
    assert p.returncode == 3, p.stdout + p.stderr
    out = by_rank(p.stdout)
    assert out[1] == ["count 0 unset", "count 1 1", "count 2 1"]
    assert out[0] == ["count 0 unset"] and out[2] == ["count 0 unset"]  # 2 exited 0: once
    assert "rank 1 exited with status 3 after 2 restarts (--max-restarts 2); stopping the " \
           "others" in p.stderr


def test_one_restart_is_said_in_the_singular(tmp_path):
    p = launch(tmp_path, ["--nproc-per-node", "2", "--max-restarts", "1", "--grace", "1",
                          "prog.py"], """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "rank 1 exited with status 3 after 1 restart (--max-restarts 1); stopping the " \
           "others" in p.stderr, p.stderr


def test_a_failure_without_restarts_is_said_in_one_line(tmp_path):
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], "import sys\nsys.exit(3)\n")
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.splitlines() == [
        "tensorplay.distributed.run: rank 0 exited with status 3; stopping the others"], p.stderr


def test_flags_are_never_abbreviated():
    """--nproc-per is no --nproc-per-node: a flag is spelled out or refused
    (an abbreviation would change meaning when a longer flag is added)."""
    from tensorplay.distributed import run as launcher
    with pytest.raises(SystemExit):
        launcher.make_parser().parse_args(["--nproc-per", "2", "prog.py"])


def test_a_line_of_exactly_the_limit_goes_out_as_it_arrives():
    """A worker's output of exactly LINE_MAX_BYTES without a newline is cut
    and emitted at once (not held for more), and a pipe with nothing to
    read yet is still open (read() True)."""
    from tensorplay.distributed import run as launcher
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(out_r, False)
    s = launcher._Stream(0, os.fdopen(r, "rb", 0), out_w, True)
    try:
        assert s.read() is True  # nothing there yet
        os.write(w, b"x" * 16384)
        assert s.read() is True
        assert os.read(out_r, 65536) == b"[0] " + b"x" * 16384 + b"\n"
    finally:
        s.close()
        for fd in (w, out_r, out_w):
            os.close(fd)


# A restarted process's pipes are closed by the launcher at their end of
# file, not left to the garbage collector: a program that runs the launcher
# with warnings on (python -X dev, pytest) sees no ResourceWarning, and the
# launcher holds as many descriptors for each incarnation as for the first.
def test_launcher_closes_the_pipes_of_each_incarnation(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os, sys, time
        time.sleep(0.5)  # the launcher has taken the end of the earlier one's output
        print("fds", len(os.listdir("/proc/%d/fd" % os.getppid())), flush=True)
        sys.exit(3 if os.environ["TORCHELASTIC_RESTART_COUNT"] != "3" else 0)
    """))
    p = subprocess.run([PYTHON, "-W", "always::ResourceWarning", "-m",
                        "tensorplay.distributed.run", "--nproc-per-node", "1",
                        "--max-restarts", "3", "--restart-rank0", "prog.py"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=env_without_secret())
    assert p.returncode == 0, p.stdout + p.stderr
    counts = by_rank(p.stdout)[0]
    assert len(counts) == 4 and len(set(counts)) == 1, counts
    assert "ResourceWarning" not in p.stderr, p.stderr


# spec: LAUNCH-6: what a process leaves in its group goes with it, both
# when it fails and is restarted and when the job ends (no orphans).
STRAGGLER_SCRIPT = """
import os, subprocess, sys
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
s = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
with open("straggler.%s" % count, "w") as f:
    f.write("%d\\n" % s.pid)
sys.exit(3 if count == "0" else 0)
"""


def test_no_process_of_a_rank_outlives_its_incarnation_or_the_job(tmp_path):
    p = launch(tmp_path, ["--nproc-per-node", "1", "--max-restarts", "1", "--restart-rank0",
                          "prog.py"], STRAGGLER_SCRIPT)
    assert p.returncode == 0, p.stdout + p.stderr
    pids = [int((tmp_path / ("straggler.%d" % n)).read_text()) for n in (0, 1)]
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [alive(pid) for pid in pids]
    for pid, living in zip(pids, left):
        if living:
            os.kill(pid, signal.SIGKILL)
    # The first incarnation's straggler went at its restart, the second's
    # when the job ended: neither is left.
    assert left == [False, False]


# A program whose first run deletes it and exits 3: its restart's exec fails
# (ENOENT). Rank 0 alone, so --restart-rank0 (LAUNCH-7).
VANISHING_PROGRAM = '#!/bin/sh\nrm -f "$0"\nexit 3\n'


# spec: LAUNCH-6, LAUNCH-8: a restart that cannot start leaves the failure
# not restarted: the job ends with the rank's status, not the launcher's.
def test_restart_that_cannot_start_ends_the_job_with_the_rank_status(tmp_path):
    prog = tmp_path / "vanishing.sh"
    prog.write_text(VANISHING_PROGRAM)
    prog.chmod(0o700)
    p = launch(tmp_path, ["--nproc-per-node", "1", "--max-restarts", "1", "--restart-rank0",
                          "--grace", "1", "--no-python", str(prog)])
    assert p.returncode == 3, p.stdout + p.stderr
    assert not prog.exists()
    assert p.stderr.splitlines() == [
        "tensorplay.distributed.run: rank 0 exited with status 3; restarting it as a new "
        "incarnation (TP_REJOIN=1), restart 1 of 1",
        "tensorplay.distributed.run: rank 0 exited with status 3; cannot restart it: No such "
        "file or directory; stopping the others"], p.stderr


# spec: LAUNCH-7
def test_rank0_is_not_restarted_with_env_store(tmp_path):
    p = launch_elastic(tmp_path, ["--max-restarts", "1"], victim=0)
    assert p.returncode == 128 + signal.SIGKILL, p.stdout + p.stderr
    assert "rank 0 was killed by signal 9; not restarting it: with init_method env:// rank 0 " \
           "serves the job's rendezvous store" in p.stderr
    assert "restarting it as" not in p.stderr


# spec: LAUNCH-7: with a store outside rank 0 (file://), --restart-rank0 restarts it.
def test_rank0_restarts_with_a_store_outside_it(tmp_path):
    p = launch_elastic(tmp_path, ["--max-restarts", "1", "--restart-rank0"], victim=0,
                       store="file")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["[1] answer [1, '1']"], p.stdout
    assert "rank 0 was killed by signal 9; restarting it" in p.stderr


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


# spec: LAUNCH-8
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


def start_stubborn(tmp_path, nproc=2, extra=()):
    (tmp_path / "prog.py").write_text(STUBBORN_SCRIPT)
    proc = subprocess.Popen(LAUNCHER + ["--nproc-per-node", str(nproc), "--grace", "1"] +
                            list(extra) + ["prog.py", str(tmp_path)],
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
    proc, pids = start_stubborn(tmp_path, extra=["--max-restarts", "3"])  # spec: LAUNCH-6
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
    assert "restarting" not in err  # the launcher stopping the job restarts nobody
    deadline = time.monotonic() + 2
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if alive(pid)] == []  # ranks and their children


def start_two(tmp_path, grace):
    """prog.py as 2 ranks with --grace, started: each wrote its pid file."""
    proc = subprocess.Popen(LAUNCHER + ["--nproc-per-node", "2", "--grace", str(grace),
                                        "prog.py", str(tmp_path)],
                            cwd=tmp_path, env=env_without_secret(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_files([tmp_path / "pid.0", tmp_path / "pid.1"])
    except BaseException:
        proc.kill()
        raise
    return proc


def test_one_signal_leaves_the_ranks_their_grace_period(tmp_path):
    """One signal to the launcher is passed on once: ranks that clean up
    within --grace finish doing so and are not killed (a launcher that took
    its own first signal for a second would SIGKILL them at once)."""
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os, pathlib, signal, sys, time
        rank = int(os.environ["RANK"])
        def on_term(sig, frame):
            time.sleep(1.0)  # cleaning up: checkpoints, logs
            print("rank %d cleaned up" % rank, flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        (pathlib.Path(sys.argv[1]) / ("pid.%d" % rank)).write_text("%d\\n" % os.getpid())
        while True:
            time.sleep(1)
    """))
    proc = start_two(tmp_path, 20)
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert sorted(out.splitlines()) == ["[0] rank 0 cleaned up", "[1] rank 1 cleaned up"], \
        out + err


def test_second_signal_kills_at_once(tmp_path):
    (tmp_path / "prog.py").write_text(STUBBORN_SCRIPT)
    proc = start_two(tmp_path, 60)
    try:
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


def test_rank_whose_launcher_died_before_the_prctl_exits(monkeypatch):
    """The window PR_SET_PDEATHSIG leaves: a launcher killed between the fork
    and the prctl never signals its child, so the child checks its parent
    after the prctl and exits when it changed; else it goes on to exec."""
    from tensorplay.distributed import run
    ppids = iter([4242, 1])  # the launcher's pid, then init's: it died
    monkeypatch.setattr(run.os, "getppid", lambda: next(ppids))
    monkeypatch.setattr(run.sys, "platform", "test")  # no prctl on pytest itself
    exits = []
    monkeypatch.setattr(run.os, "_exit", exits.append)
    run._die_with_parent()
    assert exits == [1]
    ppids = iter([4242, 4242])  # the launcher lives
    run._die_with_parent()
    assert exits == [1]


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


@pytest.mark.parametrize("keeps", ["both pipes", "stdout only"])
def test_output_a_child_writes_after_its_rank_exits_is_kept(tmp_path, keeps):
    """Once every rank exited the launcher still copies what their own
    children write to the pipes they inherited (for up to DRAIN_S, 1 s),
    rather than stopping while a pipe is open: here a child writes 0.5 s
    after its rank exited, holding both of the rank's pipes or only its
    stdout (the last pipe open is still a pipe open)."""
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], """
        import os, time
        print("rank exits", flush=True)
        rank_pid = os.getpid()
        if os.fork() == 0:
            if STDOUT_ONLY:
                os.close(2)  # the rank's stderr closes when the rank exits
            deadline = time.monotonic() + 10
            while os.getppid() == rank_pid and time.monotonic() < deadline:
                time.sleep(0.01)  # until the rank is gone
            time.sleep(0.5)
            os.write(1, b"child writes after\\n")
            os._exit(0)
    """.replace("STDOUT_ONLY", str(keeps == "stdout only")))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["[0] rank exits", "[0] child writes after"], p.stdout


def test_seed_example_through_the_launcher(tmp_path):
    seed = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "seed.py")
    p = launch(tmp_path, ["--nproc-per-node", "2", os.path.abspath(seed)], timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "[0] 7\n"


def test_launcher_ends_when_the_ranks_exit_and_their_output_closes(tmp_path):
    """Once every rank exited and every output pipe is closed, the launcher
    ends at once: the drain (DRAIN_S, here made 15 s) only waits for
    output a rank's own children still hold open; the launcher's wake-up
    pipe is not such output."""
    (tmp_path / "prog.py").write_text("print('done')\n")
    prog = ("import sys\nimport tensorplay.distributed.run as r\nr.DRAIN_S = 15\n"
            "sys.exit(r.main(sys.argv[1:]))\n")
    start = time.monotonic()
    p = subprocess.run([PYTHON, "-c", prog, "--nproc-per-node", "2", "prog.py"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=env_without_secret())
    took = time.monotonic() - start
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] done", "[1] done"]
    assert took < 12, took  # not the 15 s drain


def test_launcher_run_in_a_program_keeps_its_earlier_output_first(tmp_path):
    """A program that printed, then runs the launcher's main in its own
    process: its buffered text comes out before the ranks' lines, which the
    launcher writes straight to the descriptor."""
    (tmp_path / "prog.py").write_text('print("rank line")\n')
    wrapper = textwrap.dedent("""
        import sys
        from tensorplay.distributed import run
        sys.stdout.write("before the job\\n")
        sys.exit(run.main(["--nproc-per-node", "1", "prog.py"]))
    """)
    env = env_without_secret()
    env.pop("PYTHONUNBUFFERED", None)  # a pipe: block-buffered, as in a job's log
    p = subprocess.run([PYTHON, "-c", wrapper], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["before the job", "[0] rank line"]


def test_launcher_run_in_a_program_gives_back_its_signal_handlers(tmp_path):
    """A program that runs the launcher's main in its own process gets its own
    SIGINT and SIGTERM handlers back when the job ends, whether the job
    succeeded or failed: the launcher's handlers, which forward a signal to
    the ranks, must not outlive the job they stop."""
    (tmp_path / "ok.py").write_text('print("ok")\n')
    (tmp_path / "bad.py").write_text('import sys; sys.exit(3)\n')
    wrapper = textwrap.dedent("""
        import signal, sys
        from tensorplay.distributed import run
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGINT, mine)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        codes = [run.main(["--nproc-per-node", "1", prog]) for prog in ("ok.py", "bad.py")]
        print("codes", codes, flush=True)
        print("restored", signal.getsignal(signal.SIGINT) is mine,
              signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, flush=True)
    """)
    p = subprocess.run([PYTHON, "-c", wrapper], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env=env_without_secret())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "codes [0, 3]" in p.stdout, p.stdout + p.stderr
    assert "restored True True" in p.stdout, p.stdout + p.stderr


def test_a_partial_line_still_open_at_the_drains_end_is_kept(tmp_path):
    """When DRAIN_S runs out with a pipe still open (a child of the rank
    holds it and wrote no newline), what it wrote so far comes out as a
    line before the child's group is killed: nothing written is lost."""
    p = launch(tmp_path, ["--nproc-per-node", "1", "prog.py"], """
        import os, time
        if os.fork() == 0:
            os.write(1, b"partial")
            time.sleep(30)
            os._exit(0)
        time.sleep(0.3)
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "[0] partial\n", p.stdout


def test_stopping_signals_only_the_groups_still_running(monkeypatch):
    """The stop's SIGTERM goes to the process groups of ranks still running,
    never to the group of one that exited (its id may be another's by now)."""
    from tensorplay.distributed import run as launcher
    spec = launcher.JobSpec(launcher.make_parser().parse_args(["--nproc", "2", "prog.py"]))
    job = launcher.Job(spec, 5.0, True, 0.1)

    class P:
        def __init__(self, rc):
            self.returncode = rc
    sent = []
    monkeypatch.setattr(launcher.Job, "_killpg", staticmethod(lambda g, sig: sent.append((g, sig))))
    try:
        job.procs = [P(0), P(None)]
        job.pgids = [111, 222]
        job.begin_stop(signal.SIGTERM, 3)
        assert sent == [(222, signal.SIGTERM)]
    finally:
        job.sel.close()
        os.close(job.wake_r)
        os.close(job.wake_w)
