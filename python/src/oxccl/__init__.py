"""oxccl: NCCL's C API (libnccl.so.2), plugins and the `oxccl` command.

The wheel carries the native files; this package finds them:

    import oxccl
    oxccl.library()    # .../oxccl/lib/libnccl.so.2
    oxccl.lib_path()   # .../oxccl/lib (also the plugins)
    oxccl.plugins()    # {"net-ib": ".../libnccl-net-oxccl-ib.so", ...}

To run a program on oxccl, start it with `oxccl-run -- PROGRAM ARGS...`:
a library cannot be swapped in a process that has already mapped NCCL,
so the preload has to be set before the program starts.
"""

import os

try:
    from ._build import COMMIT, VERSION
except ImportError:  # a source tree, not an installed wheel
    VERSION, COMMIT = "unknown", ""

__version__ = VERSION

_HERE = os.path.dirname(os.path.abspath(__file__))

# Plugin kind -> (file in lib/, the NCCL_<KIND>_PLUGIN setting, name to give it).
PLUGINS = {
    "net-ib": ("libnccl-net-oxccl-ib.so", "NCCL_NET_PLUGIN", "oxccl-ib"),
    "tuner": ("libnccl-tuner-oxccl.so", "NCCL_TUNER_PLUGIN", "oxccl"),
    "profiler": ("libnccl-profiler-oxccl.so", "NCCL_PROFILER_PLUGIN", "oxccl"),
    "env": ("libnccl-env-oxccl.so", "NCCL_ENV_PLUGIN", "oxccl"),
}


def lib_path():
    """The folder holding libnccl.so.2 and the plugins."""
    return os.path.join(_HERE, "lib")


def library():
    """The path of oxccl's libnccl.so.2."""
    return os.path.join(lib_path(), "libnccl.so.2")


def bin_path():
    """The path of the `oxccl` command (perf, info, recover, keygen)."""
    return os.path.join(_HERE, "bin", "oxccl")


def plugins():
    """Plugin kind -> path of the bundled library, for those present."""
    found = {}
    for kind, (name, _, _) in PLUGINS.items():
        p = os.path.join(lib_path(), name)
        if os.path.isfile(p):
            found[kind] = p
    return found


def describe():
    """One line naming the library: path, version and commit."""
    build = f"oxccl {VERSION}" + (f", {COMMIT}" if COMMIT else "")
    return f"libnccl.so.2 = {library()} ({build})"
