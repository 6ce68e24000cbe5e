"""Which functions a callee runs for its peers (spec/api.md PY-1).

A peer names a function by module and qualified name; the callee looks it up
among modules its own program imported. That makes every imported function
callable, the interpreter's code-running entry points included, which would
turn "a member may call my functions" into "a member may run any command".
So by default the callee refuses a deny list: the ways to run code or
commands, start or signal processes, load native code, unpickle bytes,
change files and descriptors, or steer the interpreter. With
TensorPipeRpcBackendOptions(expose=[...]) it serves only what the program
named (allow-list mode). A trusted member stays trusted: the policy narrows
what a member can ask for, it does not make a hostile member harmless (its
own functions may still do anything their arguments steer them to).
"""
import builtins
import os
import sys
import types

# Whole modules whose functions run code or commands, start or signal
# processes, load native code, turn bytes into objects, change files or
# descriptors, or steer the interpreter itself.
DENIED_MODULES = frozenset({
    "subprocess", "_posixsubprocess", "pty", "ctypes", "_ctypes", "importlib", "runpy", "code",
    "codeop", "pdb", "bdb", "pickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
    "multiprocessing", "concurrent.futures.process", "webbrowser",
    # Code in strings or files (timeit.timeit("..."), cProfile.run, doctest,
    # logging.config's handlers), imports by name (pkgutil.resolve_name,
    # help("x")), pagers that run commands, site and package installers.
    "timeit", "cProfile", "profile", "doctest", "trace", "logging.config", "pkgutil",
    "zipimport", "imp", "pydoc", "_sitebuiltins", "site", "ensurepip", "venv", "distutils",
    "setuptools", "idlelib",
    # The operating system's calls (os.write and os.close reach any descriptor,
    # shutil.rmtree and pathlib.Path.unlink any file), signals, the interpreter.
    "os", "posix", "nt", "shutil", "pathlib", "io", "_io", "tempfile", "fileinput", "signal",
    "_signal", "faulthandler", "resource", "sys", "_thread",
    # Reflection that hands out any object of the process (gc.get_objects,
    # gc.get_referrers, inspect.getmembers): with an rref to a module's
    # dict, dict.update rewrites the module.
    "gc", "inspect",
    # torch's files (torch.load unpickles), its hub (downloads and runs code)
    # and its C++ extensions (compile and load native code).
    "torch.serialization", "torch.hub", "torch.utils.cpp_extension", "torch.jit._serialization",
    "torch.package", "numpy.ctypeslib", "numpy.f2py", "numpy.distutils",
})
# Read-only functions of os that stay served.
_OS_SERVED = ("getpid", "getppid", "getcwd", "cpu_count", "getloadavg", "uname", "urandom",
              "strerror", "fspath", "sched_getaffinity", "getuid", "geteuid", "getgid",
              "getegid", "get_terminal_size")
# Single functions of modules that are otherwise harmless to expose.
_DENIED_BUILTINS = ("eval", "exec", "compile", "__import__", "breakpoint", "open", "input",
                    "exit", "quit", "getattr", "setattr", "delattr", "globals", "locals", "vars")
# Functions of modules imported later (looked at once each is): numpy.load
# unpickles with allow_pickle=True, the others write or map files.
_DENIED_LATER = {"numpy": ("load", "save", "savez", "savez_compressed", "savetxt", "loadtxt",
                           "genfromtxt", "fromfile", "memmap")}


# Attribute hooks: object.__setattr__(x, name, v) is setattr by another name.
_DENIED_ATTRS = frozenset({"__setattr__", "__delattr__", "__getattribute__", "__getattr__"})


def _path_refusal(module, qualname):
    """Why the name module.qualname is not served, or None. A name reaches its
    function through modules and classes only: through an object's attributes
    a peer could reach this worker's state (_values.state.__setattr__ would
    turn allow_pickle on), through a function's __globals__ anything."""
    obj = sys.modules.get(module)
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        if part in _DENIED_ATTRS:
            return "%s is setattr, delattr or getattr by another name" % part
        if i + 1 < len(parts):
            obj = getattr(obj, part, None)
            if obj is None:
                return None  # not defined (yet): the lookup waits for it or says so
            if not isinstance(obj, (types.ModuleType, type)):
                return ("the name goes through %s, a %s: names reach functions through modules "
                        "and classes only" % (".".join(parts[:i + 1]), type(obj).__name__))
    return None


def check_name(module, qualname):
    """Raises PermissionError when a peer's name module.qualname (its module
    imported) does not reach its function through modules and classes. Run
    before the name is resolved: an instance's attribute is never read for a
    peer (a property's getter would run)."""
    why = _path_refusal(module, qualname)
    if why is not None:  # in allow-list mode too: an exposed module's state is not exposed
        raise PermissionError("function %s.%s is refused by this worker's exposure policy: %s"
                              % (module, qualname, why))


def _denied_objects():
    out = set()
    for name in _DENIED_BUILTINS:
        f = getattr(builtins, name, None)
        if f is not None:
            out.add(id(f))
    return out


_DENIED_IDS = _denied_objects()
_DENIED_WHY = ("it runs code or commands, starts or signals processes, loads native code, "
               "unpickles bytes, or changes files, descriptors or the interpreter")
_SERVED_IDS = frozenset(id(getattr(os, n)) for n in _OS_SERVED if hasattr(os, n))
_later_seen = set()


def _denied_later(obj):
    """Whether obj is one of _DENIED_LATER's functions, collecting them for
    each of its modules once the program imported it."""
    for module, names in _DENIED_LATER.items():
        mod = sys.modules.get(module)
        if mod is not None and module not in _later_seen:
            _DENIED_IDS.update(id(getattr(mod, n)) for n in names if hasattr(mod, n))
            _later_seen.add(module)
    return id(obj) in _DENIED_IDS


def _module_denied(module):
    """Whether module is one of DENIED_MODULES or inside one: one set lookup
    per dotted prefix (a scan of the list took 10 us of every call served)."""
    i = module.find(".")
    while i >= 0:
        if module[:i] in DENIED_MODULES:
            return True
        i = module.find(".", i + 1)
    return module in DENIED_MODULES


class Policy:
    """The running worker's policy: deny-list mode (expose None) or the
    allow-list of what the program named."""

    def __init__(self, expose=None):
        self.allow = None
        if expose is not None:
            self.allow_ids, self.allow_names, self.allow_modules = set(), set(), set()
            for item in expose:
                if isinstance(item, types.ModuleType):
                    self.allow_modules.add(item.__name__)
                elif isinstance(item, str):
                    self.allow_names.add(item)
                elif callable(item):
                    self.allow_ids.add(id(item))
                    self.allow_names.add("%s.%s" % (getattr(item, "__module__", "?"),
                                                    getattr(item, "__qualname__", "?")))
                else:
                    raise TypeError("expose takes functions, classes, modules and "
                                    "'module.qualname' strings, not %r" % (item,))
            self.allow = True

    def may_allow(self, module, qualname):
        """False when no function named module.qualname can be served (allow-list
        mode, its name and module not exposed): a call for it is refused at
        once instead of waiting for the name to be defined."""
        if not self.allow:
            return True
        return module in self.allow_modules or "%s.%s" % (module, qualname) in self.allow_names

    def check(self, module, qualname, obj):
        """Raises PermissionError when obj (module.qualname) is not served. The
        name itself passed check_name before obj was looked up (both callers,
        api._find and _values' "callable" values, do that first)."""
        what = "%s.%s" % (module, qualname)
        if getattr(obj, "_tp_internal", False):
            return  # the package's own helpers (to_here of objects, gathers)
        if self.allow:
            if id(obj) in self.allow_ids or what in self.allow_names or \
                    module in self.allow_modules:
                return
            raise PermissionError(
                "function %s is not exposed by this worker's policy: this worker serves only what "
                "TensorPipeRpcBackendOptions(expose=[...]) names" % what)
        if self._denied(module, obj):
            raise PermissionError(
                "function %s is refused by this worker's exposure policy: %s; a worker that "
                "must serve it names it in TensorPipeRpcBackendOptions(expose=[...])"
                % (what, _DENIED_WHY))

    @staticmethod
    def _denied(module, obj):
        real_module = getattr(obj, "__module__", None) or ""
        if id(obj) in _SERVED_IDS:
            return False
        return _denied_later(obj) or _module_denied(module) or \
            (isinstance(real_module, str) and _module_denied(real_module))

    def check_method(self, obj, name, fn):
        """Raises PermissionError when a peer may not call method name (fn,
        resolved on obj, a value this worker holds): private and special
        names are never served (only methods new_method added), since from
        them every object of the process is reachable; in deny-list mode a
        method that is itself a denied function (os.system reached through
        a module held in an rref) is refused; in allow-list mode the
        object's class (or module) must be exposed, or the function."""
        what = "%s.%s" % (type(obj).__qualname__, name)
        if name.startswith("_"):
            raise PermissionError(
                "method %s is not served to peers: private and special methods are refused by "
                "the exposure policy (new_method adds a method that is)" % what)
        target = getattr(fn, "__func__", fn)
        if self.allow:
            for klass in type(obj).__mro__:
                if id(klass) in self.allow_ids or klass.__module__ in self.allow_modules or \
                        "%s.%s" % (klass.__module__, klass.__qualname__) in self.allow_names:
                    return
            if id(target) in self.allow_ids:
                return
            raise PermissionError(
                "method %s is not exposed by this worker's policy: expose=[...] names neither "
                "its class nor it" % what)
        # A method has no module a peer named: _denied reads target's own.
        if self._denied("", target):
            raise PermissionError(
                "method %s is refused by this worker's exposure policy: %s" % (what, _DENIED_WHY))
