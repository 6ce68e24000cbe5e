"""The in-tree PEP 517 build backend of the Python package (issue 20).

`pip install .` and `pip wheel .` call it. It needs nothing but the standard
library, CMake and a C compiler, so it builds on a machine that reaches only
Debian's archive: pip's isolated build environment installs nothing
(`requires = []`). It configures the project with CMake for the interpreter
running the build (sys.executable), builds the library and the extension
tensorplay._rpc (the library linked in statically, so the wheel needs only
libuv, SQLite and OpenSSL from the system), and writes the wheel itself.

config_settings (pip install --config-settings KEY=VALUE):
  build-dir   reuse this CMake build directory (default: a fresh temporary one);
              one of its own: the configure step turns tests and fuzzers off there
  build-type  CMAKE_BUILD_TYPE (default Release; asserts stay on in every type)
  cmake-args  more arguments for the configure step, split as a shell would
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_SRC = os.path.join(ROOT, "python")  # holds the package folder tensorplay/
GENERATOR = "tensorplay_build (in-tree)"
# Zip entries need a date; one fixed date (or SOURCE_DATE_EPOCH) makes wheels reproducible.
EPOCH = max(315532800, int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))  # 1980-01-01


class BuildError(Exception):
    """The build cannot go on; the message says why and what to install."""


# ---------------------------------------------------------------- metadata

def _load_toml(path):
    try:
        import tomllib  # Python 3.11+
        with open(path, "rb") as f:
            return tomllib.load(f)
    except ImportError:
        pass
    # Before 3.11: the small subset pyproject.toml uses (tables, strings, string arrays).
    import ast
    data = table = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line)
            if m:
                table = data
                for part in m.group(1).split("."):
                    table = table.setdefault(part, {})
                continue
            key, _, value = line.partition("=")
            table[key.strip().strip('"')] = ast.literal_eval(value.strip())
    return data


def _project():
    """[project] of pyproject.toml, with the version from CMakeLists.txt (one source)."""
    project = dict(_load_toml(os.path.join(ROOT, "pyproject.toml")).get("project", {}))
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*\S+\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise BuildError("cannot find project(... VERSION x.y.z) in CMakeLists.txt")
    project["version"] = m.group(1)
    return project


def _dist_name(project):
    return re.sub(r"[-_.]+", "_", project["name"]).lower()


def _metadata(project):
    lines = ["Metadata-Version: 2.1", "Name: " + project["name"],
             "Version: " + project["version"]]
    if project.get("description"):
        lines.append("Summary: " + project["description"])
    if project.get("requires-python"):
        lines.append("Requires-Python: " + project["requires-python"])
    lic = project.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: " + lic["text"])
    for url_name, url in project.get("urls", {}).items():
        lines.append("Project-URL: %s, %s" % (url_name, url))
    for cls in project.get("classifiers", []):
        lines.append("Classifier: " + cls)
    return "\n".join(lines) + "\n"


def _entry_points(project):
    scripts = project.get("scripts", {})
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join("%s = %s\n" % kv for kv in scripts.items())


def _wheel_tag():
    """interpreter-abi-platform of this interpreter, as the `packaging` library names it."""
    if sys.implementation.name != "cpython":
        raise BuildError("the extension tensorplay._rpc uses CPython's C API; this is %s"
                         % sys.implementation.name)
    ver = "%d%d" % sys.version_info[:2]
    abi = "cp" + ver + getattr(sys, "abiflags", "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if sys.maxsize <= 2 ** 32:  # a 32-bit interpreter on a 64-bit kernel
        plat = {"linux_x86_64": "linux_i686", "linux_aarch64": "linux_armv7l"}.get(plat, plat)
    return "cp%s-%s-%s" % (ver, abi, plat)


def _dist_info_files(project, tag):
    """(name, bytes) of the .dist-info folder, RECORD aside."""
    files = [("METADATA", _metadata(project)),
             ("WHEEL", "Wheel-Version: 1.0\nGenerator: %s\nRoot-Is-Purelib: false\nTag: %s\n"
              % (GENERATOR, tag)),
             ("top_level.txt", "tensorplay\n")]
    ep = _entry_points(project)
    if ep:
        files.append(("entry_points.txt", ep))
    return [(n, t.encode()) for n, t in files]


# ---------------------------------------------------------------- the build

def _setting(config_settings, key, default=None):
    value = (config_settings or {}).get(key, default)
    if isinstance(value, list):  # pip passes a repeated key as a list
        value = " ".join(value)
    return value


def _check_tools():
    include = sysconfig.get_paths().get("include", "")
    if not os.path.exists(os.path.join(include, "Python.h")):
        short = "python%d.%d" % sys.version_info[:2]
        raise BuildError(
            "Python.h is not in %s: the extension tensorplay._rpc needs the development "
            "headers of %s (%s).\nOn Debian or Ubuntu: apt-get install python3-dev "
            "(or %s-dev for an interpreter other than the default python3)."
            % (include or "this interpreter's include path", sys.executable, short, short))
    for tool, pkg in (("cmake", "cmake"), ("cc", "gcc")):
        if not shutil.which(tool) and not (tool == "cc" and os.environ.get("CC")):
            raise BuildError("%s is not on PATH: apt-get install %s" % (tool, pkg))


def _run(cmd, hint):
    sys.stderr.write("tensorplay_build: %s\n" % " ".join(shlex.quote(c) for c in cmd))
    sys.stderr.flush()
    # CMake's chatter goes to stderr too: pip shows it with -v or when the build fails.
    try:
        out = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        out = None
    rc = subprocess.call(cmd, stdout=out)
    if rc != 0:
        raise BuildError("%s failed (exit status %d). %s" % (cmd[1] if len(cmd) > 1 else cmd[0],
                                                             rc, hint))


def build_extension(config_settings=None, build_dir=None):
    """Configures and builds the library and tensorplay._rpc; the module's path."""
    _check_tools()
    build_dir = _setting(config_settings, "build-dir") or build_dir
    if not build_dir:
        raise BuildError("no build directory")
    build_type = _setting(config_settings, "build-type", "Release")
    extra = shlex.split(_setting(config_settings, "cmake-args", "") or "")
    deps_hint = ("The Debian packages the build needs are listed in scripts/install-deps.sh "
                 "(as root it installs them).")
    _run(["cmake", "-S", ROOT, "-B", build_dir, "-DPython3_EXECUTABLE=" + sys.executable,
          "-DCMAKE_BUILD_TYPE=" + build_type, "-DTP_BUILD_TESTS=OFF", "-DTP_BUILD_FUZZ=OFF",
          "-DTP_SANITIZE=OFF", "-DTP_REQUIRE_PYTHON=ON"] + extra, deps_hint)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run(["cmake", "--build", build_dir, "--target", "tensorplay_py", "--parallel", jobs],
         deps_hint)
    ext = os.path.join(build_dir, "python", "tensorplay",
                       "_rpc" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(ext):
        raise BuildError("the build made no %s (built for another interpreter than %s?)"
                         % (ext, sys.executable))
    return ext


def _package_files():
    """(path in the wheel, path on disk) of the pure-Python package, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(PACKAGE_SRC, "tensorplay")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                out.append((os.path.relpath(path, PACKAGE_SRC).replace(os.sep, "/"), path))
    return out


# ---------------------------------------------------------------- writing

def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d\n" % (arcname, digest, len(data))


class _Wheel:
    """A wheel written entry by entry; close() adds RECORD last."""

    def __init__(self, path, dist_info):
        self.zf = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.dist_info = dist_info
        self.record = []

    def add(self, arcname, data, executable=False):
        info = zipfile.ZipInfo(arcname, date_time=_zip_time())
        info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, data)
        self.record.append(_record_line(arcname, data))

    def close(self):
        record = self.dist_info + "/RECORD"
        self.record.append(record + ",,\n")
        info = zipfile.ZipInfo(record, date_time=_zip_time())
        info.external_attr = (0o644 | 0o100000) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, "".join(self.record))
        self.zf.close()


def _zip_time():
    return time.gmtime(EPOCH)[:6]


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _write_wheel(wheel_directory, project, contents):
    """contents: (arcname, bytes, executable); the wheel's file name."""
    tag = _wheel_tag()
    dist = "%s-%s" % (_dist_name(project), project["version"])
    name = "%s-%s.whl" % (dist, tag)
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, name)
    tmp = path + ".part"
    wheel = _Wheel(tmp, dist + ".dist-info")
    try:
        for arcname, data, executable in contents:
            wheel.add(arcname, data, executable)
        for fname, data in _dist_info_files(project, tag):
            wheel.add(dist + ".dist-info/" + fname, data)
        wheel.close()
    except BaseException:
        wheel.zf.close()
        os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return name


# ---------------------------------------------------------------- PEP 517 hooks

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project = _project()
    dist_info = "%s-%s.dist-info" % (_dist_name(project), project["version"])
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for fname, data in _dist_info_files(project, _wheel_tag()):
        with open(os.path.join(metadata_directory, dist_info, fname), "wb") as f:
            f.write(data)
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """The package, its extension and the launcher as a wheel for this interpreter."""
    project = _project()
    with tempfile.TemporaryDirectory(prefix="tensorplay-build-") as tmp:
        ext = build_extension(config_settings, os.path.join(tmp, "build"))
        contents = [(arc, _read(path), False) for arc, path in _package_files()]
        contents.append(("tensorplay/" + os.path.basename(ext), _read(ext), True))
        contents.sort()
        return _write_wheel(wheel_directory, project, contents)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: python/ on sys.path through a .pth file, the extension
    built in place beside the sources (python/tensorplay/_rpc*.so, git-ignored) from
    build-editable/, kept between runs. Edits to .py files show at once; after an
    edit to C, run `pip install -e .` again."""
    project = _project()
    ext = build_extension(config_settings, os.path.join(ROOT, "build-editable"))
    shutil.copy2(ext, os.path.join(PACKAGE_SRC, "tensorplay", os.path.basename(ext)))
    pth = "__editable__.%s.pth" % _dist_name(project)
    return _write_wheel(wheel_directory, project, [(pth, (PACKAGE_SRC + "\n").encode(), False)])


def _sdist_files():
    """Relative paths of the source tree: git's view when there is one, else a walk."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        skip = re.compile(r"^(build[^/]*|\.git|fuzz/findings)$|(^|/)__pycache__$")
        for dirpath, dirnames, filenames in os.walk(ROOT):
            rel = os.path.relpath(dirpath, ROOT)
            dirnames[:] = [d for d in dirnames
                           if not skip.search(os.path.normpath(os.path.join(rel, d)))]
            files += [os.path.normpath(os.path.join(rel, f)) for f in filenames]
    return sorted(f for f in files if os.path.isfile(os.path.join(ROOT, f))
                  and not f.endswith((".so", ".o", ".pyc")))


def build_sdist(sdist_directory, config_settings=None):
    """The source tree (as git sees it, untracked files that are not ignored included)
    with PKG-INFO, as NAME-VERSION.tar.gz."""
    project = _project()
    base = "%s-%s" % (_dist_name(project), project["version"])
    os.makedirs(sdist_directory, exist_ok=True)
    name = base + ".tar.gz"
    path = os.path.join(sdist_directory, name)

    def norm(info):
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = EPOCH
        return info

    with tarfile.open(path + ".part", "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in _sdist_files():
            tar.add(os.path.join(ROOT, rel), arcname=base + "/" + rel, recursive=False,
                    filter=norm)
        pkg_info = _metadata(project).encode()
        info = norm(tarfile.TarInfo(base + "/PKG-INFO"))
        info.size, info.mode = len(pkg_info), 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
    os.replace(path + ".part", path)
    return name


def _main(argv):
    """For a person at a terminal: `python3 scripts/pep517/tensorplay_build.py wheel DIR`."""
    if len(argv) != 3 or argv[1] not in ("wheel", "sdist"):
        sys.stderr.write("usage: %s wheel|sdist DIR\n" % argv[0])
        return 2
    hook = build_wheel if argv[1] == "wheel" else build_sdist
    print(os.path.join(argv[2], hook(argv[2])))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv))
    except BuildError as e:
        sys.stderr.write("tensorplay_build: %s\n" % e)
        sys.exit(1)
