"""What a global a pickle references would do if it were imported: the verdicts behind TIE010/TIE011.

tieaudit never imports or calls a pickle's globals; outside its allowlist each one becomes an inert
placeholder (``torch_records.Placeholder``). This module only names them:

- ``allowed``: on tieaudit's allowlist (what ``torch.load(weights_only=True)`` reads), read for real;
- ``runs-code``: importing or calling it can run code, touch files, the network or the interpreter
  under ``torch.load(weights_only=False)`` or ``pickle.load`` (TIE010, an error);
- ``known-data``: a class known to hold plain data (numpy arrays, ``argparse.Namespace``, dates...),
  read as a placeholder and reported, but not a finding;
- ``unknown``: anything else: a class whose constructor or ``__setstate__`` tieaudit cannot vouch
  for (TIE011, a note).

``RUNS_CODE`` is a superset of the dangerous lists of picklescan 1.0.5 (``_unsafe_globals``) and
modelscan 0.8.8 (``unsafe_globals``, every severity), checked by ``tests/test_pickle_scanners.py``.
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["allowed", "runs-code", "known-data", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("runs-code", "unknown", "known-data", "allowed")
"""Most dangerous first (the order reports list them in)."""

ANY = "*"

_BUILTINS_THAT_RUN = frozenset(
    "eval exec compile getattr setattr delattr __import__ open apply breakpoint execfile input "
    "globals locals vars help exit quit memoryview".split()
)
"""builtins (``__builtin__`` in protocol 0-2 pickles, renamed on reading) that run code, reach
objects' attributes or the file system."""

RUNS_CODE: dict[str, frozenset[str] | str] = {
    "builtins": _BUILTINS_THAT_RUN,
    "__builtin__": _BUILTINS_THAT_RUN,
    # processes, the interpreter, the file system, the network
    **dict.fromkeys(
        "os nt posix subprocess commands popen2 sys pty shutil socket ssl runpy importlib imp pkgutil "
        "code codeop "
        "pickle _pickle cPickle pickletools marshal shelve dill cloudpickle joblib ctypes _ctypes "
        "multiprocessing threading _thread signal asyncio selectors select mmap resource fcntl "
        "tempfile glob fileinput zipimport zipfile tarfile logging.handlers logging.config "
        "webbrowser http httplib urllib urllib2 urllib3 requests aiohttp ftplib smtplib "
        "telnetlib imaplib poplib xmlrpc socketserver "
        "pdb bdb trace cProfile profile timeit doctest pydoc ensurepip pip venv distutils setuptools "
        "idlelib lib2to3 test _osx_support _aix_support _pyrepl uuid".split(),
        ANY,
    ),
    "operator": frozenset({"attrgetter", "itemgetter", "methodcaller"}),
    "_operator": frozenset({"attrgetter", "itemgetter", "methodcaller"}),
    "functools": frozenset({"partial", "reduce", "partialmethod"}),
    "types": frozenset({"CodeType", "FunctionType", "MethodType", "LambdaType", "ModuleType"}),
    "io": frozenset({"open", "open_code", "FileIO"}),
    "_io": frozenset({"open", "open_code", "FileIO"}),
    "logging": frozenset({"FileHandler", "basicConfig"}),
    "numpy": frozenset({"load", "loadtxt", "fromfile", "genfromtxt", "save", "savez"}),
    "numpy.lib.npyio": ANY,
    "numpy.f2py": ANY,
    "numpy.testing": ANY,
    "numpy.distutils": ANY,
    "torch": frozenset({"load", "save", "compile", "_load_global_deps"}),
    **dict.fromkeys(
        "torch.serialization torch.hub torch.jit torch.package torch.utils.cpp_extension "
        "torch._inductor torch._dynamo torch.fx.experimental.symbolic_shapes torch.utils.collect_env "
        "torch.utils.bottleneck torch.utils._config_module torch.utils.data.datapipes.utils.decoder "
        "torch.distributed torch.multiprocessing torch._export torch.export".split(),
        ANY,
    ),
    "torch.fx.graph_module": frozenset(
        {
            "reduce_graph_module",
            "reduce_package_graph_module",
            "reduce_deploy_graph_module",
            "_exec_with_source",
        }
    ),
    "torch.jit.unsupported_tensor_ops": ANY,
}
"""Modules where every name (``*``) or the listed names run code when a pickle imports or calls them.
A listed module covers its submodules (``os`` covers ``os.path``)."""

KNOWN_DATA: dict[str, frozenset[str] | str] = {
    "numpy": frozenset(
        {
            "ndarray",
            "dtype",
            "bool_",
            "float16",
            "float32",
            "float64",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "complex64",
            "complex128",
            "longlong",
            "ulonglong",
            "str_",
            "bytes_",
            "generic",
        }
    ),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy.dtypes": ANY,
    "numpy.random._pickle": frozenset({"__randomstate_ctor", "__generator_ctor", "__bit_generator_ctor"}),
    "numpy.random.mtrand": frozenset({"RandomState"}),
    "numpy.random._mt19937": frozenset({"MT19937"}),
    "argparse": frozenset({"Namespace"}),
    "builtins": frozenset(
        {
            "set",
            "frozenset",
            "slice",
            "range",
            "complex",
            "bytearray",
            "object",
            "dict",
            "list",
            "tuple",
            "int",
            "float",
            "str",
            "bytes",
            "bool",
            "type",
        }
    ),
    "collections": frozenset({"OrderedDict", "Counter", "defaultdict", "deque"}),
    "datetime": frozenset({"datetime", "date", "time", "timedelta", "timezone"}),
    "decimal": frozenset({"Decimal"}),
    "pathlib": frozenset(
        {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"}
    ),
    "fractions": frozenset({"Fraction"}),
    "enum": frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}),
    "torch": frozenset({"Size", "device", "dtype", "float32", "Generator"}),
    "torch.nn.parameter": frozenset({"Parameter", "Buffer", "UninitializedParameter"}),
}
"""Classes (and their reconstructors) known to hold plain data: read as placeholders, not findings."""


def _matches(table: dict[str, frozenset[str] | str], module: str, name: str) -> bool:
    parts = module.split(".")
    first = name.split(".", 1)[0]  # "Class.method" names a method of Class
    for end in range(len(parts), 0, -1):
        listed = table.get(".".join(parts[:end]))
        if listed is None:
            continue
        if listed == ANY or (end == len(parts) and (name in listed or first in listed)):
            return True
    return False


def _reaches_inside(name: str) -> bool:
    """A dotted name walking through a dunder attribute (``f.__globals__``, ``C.__subclasses__``):
    under protocol 4 pickle resolves it attribute by attribute, reaching any object."""
    parts = name.split(".")
    return len(parts) > 1 and any(p.startswith("__") and p.endswith("__") for p in parts)


def classify(module: str, name: str, *, allowed: bool) -> Verdict:
    """The verdict for GLOBAL module.name (``allowed``: on the reader's allowlist)."""
    if allowed:
        return "allowed"
    if _matches(RUNS_CODE, module, name) or _reaches_inside(name):
        return "runs-code"
    if _matches(KNOWN_DATA, module, name):
        return "known-data"
    return "unknown"
