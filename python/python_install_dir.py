"""Where `make install PREFIX=P` puts the package tensorplay, asked of the
interpreter the package is built for (python/CMakeLists.txt runs it at install
time, when the prefix is known).

    python3 -E python_install_dir.py PREFIX [OVERRIDE]

Prints two lines: the directory, and "searched" when the interpreter finds
packages there (it is on its sys.path, or will be once it exists), else
"not-searched". The directory is, in order: OVERRIDE (relative to PREFIX
unless absolute); the interpreter's own site directory under PREFIX/lib, so
Debian's python3 gets /usr/local/lib/python3.X/dist-packages for PREFIX
/usr/local and /usr/lib/python3/dist-packages for /usr, and a virtual
environment its site-packages; else the posix_prefix scheme's platlib under
PREFIX (PREFIX/lib/python3.X/site-packages), which the caller must then add
to PYTHONPATH.
"""
import os
import site
import sys
import sysconfig


def _real(p):
    return os.path.realpath(os.path.abspath(p))


def site_dirs():
    """Directories the interpreter searches for packages, in its order."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    dirs += [sysconfig.get_path("platlib"), sysconfig.get_path("purelib")]
    return [d for d in dirs if d]


def install_dir(prefix, override=""):
    prefix = _real(prefix)
    if override:
        return _real(os.path.join(prefix, override))  # an absolute override wins in join
    libdirs = {"lib", "lib64", getattr(sys, "platlibdir", "lib")}
    for d in site_dirs():
        rel = os.path.relpath(_real(d), prefix)
        if not rel.startswith(os.pardir) and rel.split(os.sep)[0] in libdirs:
            return _real(d)
    scheme = "posix_prefix" if os.name == "posix" else "nt"
    return _real(sysconfig.get_path("platlib", scheme,
                                    vars={"base": prefix, "platbase": prefix,
                                          "installed_base": prefix,
                                          "installed_platbase": prefix}))


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: python_install_dir.py PREFIX [OVERRIDE]\n")
        return 2
    d = install_dir(argv[1], argv[2] if len(argv) == 3 else "")
    searched = {_real(p) for p in sys.path + site_dirs() if p}
    print(d)
    print("searched" if d in searched else "not-searched")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
