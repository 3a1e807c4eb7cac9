"""The wheel's console entries: `oxccl` and `oxccl-run`."""

import os
import sys

import oxccl

RUN_USAGE = """\
usage: oxccl-run [--plugins[=KINDS]] [--] PROGRAM [ARGS...]

Runs PROGRAM on oxccl: LD_PRELOAD names the wheel's libnccl.so.2 and its
lib folder goes first on LD_LIBRARY_PATH, so that PyTorch, nccl-tests or
any program linked against NCCL (libnccl.so.2) runs on oxccl. One line on
stderr says which library and plugins will be loaded (OXCCL_RUN_QUIET=1:
no line).

options:
  --plugins          also load the bundled plugins: net-ib (used where
                     there are InfiniBand/RoCE devices, else the built-in
                     socket network is), tuner, profiler (writes a trace
                     per rank, OXCCL_PROFILER_DIR) and env, by setting
                     NCCL_<KIND>_PLUGIN to each file; a value already in
                     the environment is kept
  --plugins=KINDS    only these: a comma list of net-ib, tuner, profiler,
                     env
  -h, --help         this text
  --version          the library's path, version and commit

examples:
  oxccl-run -- torchrun --nproc-per-node 2 train.py
  oxccl-run -- oxccl perf --ranks 2 -b 8 -e 1M -f 4
  oxccl-run --plugins=tuner,profiler -- ./all_reduce_perf -g 2
"""


def _die(msg, code=2):
    sys.stderr.write(f"oxccl-run: {msg}\n")
    sys.exit(code)


def oxccl_main():
    """`oxccl ARGS...`: the bundled command, in this process's place."""
    exe = oxccl.bin_path()
    if not os.path.isfile(exe):
        sys.stderr.write(f"oxccl: {exe} is missing: reinstall the oxccl wheel\n")
        sys.exit(127)
    if not os.access(exe, os.X_OK):
        os.chmod(exe, 0o755)
    os.execv(exe, [exe] + sys.argv[1:])


def _parse(argv):
    """(plugin kinds asked for, program argv)."""
    kinds = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-h", "--help"):
            sys.stdout.write(RUN_USAGE)
            sys.exit(0)
        if a == "--version":
            print(oxccl.describe())
            sys.exit(0)
        if a == "--plugins":
            kinds = list(oxccl.PLUGINS)
        elif a.startswith("--plugins="):
            value = a.split("=", 1)[1]
            names = [k.strip() for k in value.split(",") if k.strip()]
            for k in names:
                if k not in oxccl.PLUGINS:
                    _die(f"--plugins: unknown kind {k!r}; the kinds are "
                         f"{', '.join(oxccl.PLUGINS)}")
            kinds = names
        elif a.startswith("-"):
            _die(f"unknown option {a!r}; put the program after --\n\n{RUN_USAGE}")
        else:
            break
        i += 1
    program = argv[i:]
    if not program:
        _die(f"no program given\n\n{RUN_USAGE}")
    return kinds, program


def _prepend(env, key, value, sep):
    old = env.get(key, "")
    env[key] = value + (sep + old if old else "")


def run_env(kinds, environ=None):
    """The environment a program runs on oxccl with, and the line saying so."""
    env = dict(os.environ if environ is None else environ)
    lib, libdir = oxccl.library(), oxccl.lib_path()
    if not os.path.isfile(lib):
        _die(f"{lib} is missing: reinstall the oxccl wheel", 127)
    _prepend(env, "LD_PRELOAD", lib, ":")
    _prepend(env, "LD_LIBRARY_PATH", libdir, ":")
    bundled = oxccl.plugins()
    for k in kinds:
        if k not in bundled:
            _die(f"--plugins: this wheel holds no {k} plugin")
        key = oxccl.PLUGINS[k][1]
        if not env.get(key):
            env[key] = bundled[k]
    loading = []
    for kind, (_, key, name) in oxccl.PLUGINS.items():
        v = env.get(key, "").strip()
        if not v or v.lower() == "none":
            continue
        ours = v in (bundled.get(kind), name, oxccl.PLUGINS[kind][0])
        loading.append(kind if ours else f"{key}={v}")
    line = f"oxccl-run: {oxccl.describe()}; plugins in {libdir}: {', '.join(bundled) or 'none'}"
    if loading:
        line += f"; loading: {', '.join(loading)}"
    else:
        line += " (load with NCCL_*_PLUGIN=oxccl, net-ib as oxccl-ib, or oxccl-run --plugins)"
    return env, line


def run_main():
    """`oxccl-run [--plugins[=KINDS]] -- PROGRAM ARGS...`"""
    kinds, program = _parse(sys.argv[1:])
    env, line = run_env(kinds)
    if os.environ.get("OXCCL_RUN_QUIET", "").strip() != "1":
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    try:
        os.execvpe(program[0], program, env)
    except FileNotFoundError:
        _die(f"{program[0]}: no such program", 127)
    except PermissionError:
        _die(f"{program[0]}: not executable", 126)
