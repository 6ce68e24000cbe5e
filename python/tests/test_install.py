"""pip install . into a fresh virtual environment, offline (issue 20): the
in-tree backend (scripts/pep517/tensorplay_build.py) builds the library and
the extension with nothing from PyPI; the installed package imports from the
venv, and the seed example runs through the installed launcher.

Builds the library (about 15 s on two cores). TP_SKIP_INSTALL_TEST=1 skips it."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON = os.environ.get("PYTHON", sys.executable)

pytestmark = pytest.mark.skipif(os.environ.get("TP_SKIP_INSTALL_TEST", "") not in ("", "0"),
                                reason="TP_SKIP_INSTALL_TEST is set")


def clean_env(**extra):
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "TP_SECRET", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
              "PIP_FIND_LINKS"):
        env.pop(k, None)
    env.update(extra)
    return env


def run(cmd, timeout, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, "%s\n%s\n%s" % (cmd, p.stdout[-4000:], p.stderr[-4000:])
    return p


def test_pip_install_offline_then_launch(tmp_path):
    if subprocess.run([PYTHON, "-c", "import ensurepip, venv"],
                      capture_output=True).returncode != 0:
        pytest.fail("%s cannot make a venv: apt-get install python3-venv" % PYTHON)
    venv = tmp_path / "venv"
    run([PYTHON, "-m", "venv", str(venv)], 60, env=clean_env())
    py = str(venv / "bin" / "python")
    # --no-index: PyPI out of reach; build isolation stays on, as for a user.
    env = clean_env(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                    CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    run([py, "-m", "pip", "install", "--no-cache-dir", ROOT], 240, env=env, cwd=tmp_path)

    p = run([py, "-c", "import tensorplay._rpc as m, tensorplay.distributed.rpc as rpc;"
                       "print(rpc.is_available()); print(m.__file__)"],
            30, env=clean_env(), cwd=tmp_path)
    available, ext = p.stdout.split()
    assert available == "True"
    assert ext.startswith(str(venv) + os.sep), ext  # the venv's copy, not the build tree's

    seed = os.path.join(ROOT, "examples", "python", "seed.py")
    p = run([py, "-m", "tensorplay.distributed.run", "--nproc-per-node", "2", seed], 120,
            env=clean_env(), cwd=tmp_path)
    assert p.stdout == "[0] 7\n", p.stdout + p.stderr
    p = run([str(venv / "bin" / "tensorplay-run"), "--nproc_per_node", "2", seed], 120,
            env=clean_env(), cwd=tmp_path)
    assert p.stdout == "[0] 7\n", p.stdout + p.stderr
