"""Builds the oxccl wheel's native part with cargo and copies it in.

`pip wheel python/` (setuptools from the registry, through PEP 517) runs
build_py below, which:

1. runs `cargo build --release -p oxccl-capi -p oxccl-cli -p <plugins>` in
   the workspace (the folder above this one, or OXCCL_SOURCE_DIR), with
   debug info off and stripped through cargo's own `--config` (the
   workspace profile keeps `debug = 1` for profiling; the wheel has no use
   for it, and cargo needs no `strip` tool for this). Cargo puts the files
   where it always does: CARGO_TARGET_DIR, `build.target-dir`, or
   target/ (read back from `cargo metadata`). CARGO names another cargo.
2. copies into the package: lib/libnccl.so.2 (the capi cdylib, whose
   SONAME is libnccl.so.2), the plugins under NCCL's file names so that
   NCCL_<KIND>_PLUGIN=oxccl finds them on the library path
   (libnccl-net-oxccl-ib.so, libnccl-tuner-oxccl.so,
   libnccl-profiler-oxccl.so, libnccl-env-oxccl.so), bin/oxccl, and
   _build.py (version and commit).

The wheel is tagged py3-none-linux_<arch>: the files hold no Python
extension (any Python 3 runs them) but are native code for this
platform. Not manylinux: that tag promises the binaries need no newer
glibc than the policy's and only libraries it allows, which holds only
when built in a manylinux container (or checked by auditwheel); this
wheel is built for the machine it is built on, or one like it.
"""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent

# (cargo package, file cargo writes, folder in the package, name there).
ARTIFACTS = [
    ("oxccl-capi", "libnccl.so", "lib", "libnccl.so.2"),
    ("oxccl-net-ib", "liboxccl_net_ib.so", "lib", "libnccl-net-oxccl-ib.so"),
    ("oxccl-tuner", "liboxccl_tuner.so", "lib", "libnccl-tuner-oxccl.so"),
    ("oxccl-profiler", "liboxccl_profiler.so", "lib", "libnccl-profiler-oxccl.so"),
    ("oxccl-env", "liboxccl_env.so", "lib", "libnccl-env-oxccl.so"),
    ("oxccl-cli", "oxccl", "bin", "oxccl"),
]


def fail(msg):
    sys.stderr.write(f"oxccl wheel: {msg}\n")
    raise SystemExit(1)


def workspace_root():
    root = Path(os.environ.get("OXCCL_SOURCE_DIR") or HERE.parent).resolve()
    manifest = root / "Cargo.toml"
    if not manifest.is_file() or "[workspace]" not in manifest.read_text():
        fail(
            f"{root} is not the oxccl workspace (no Cargo.toml with [workspace]); "
            "build from the repository's python/ folder, or set OXCCL_SOURCE_DIR"
        )
    return root


def workspace_version(root):
    text = (root / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[-1]
    m = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M)
    if not m:
        fail(f"no version in [workspace.package] of {root / 'Cargo.toml'}")
    return m.group(1)


def commit(root):
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cargo(root, *args, capture=False):
    exe = os.environ.get("CARGO") or shutil.which("cargo")
    if not exe:
        fail("cargo not found on PATH: install Rust (rustup.rs) or set CARGO")
    cmd = [exe, *args]
    print("oxccl wheel: " + " ".join(cmd), flush=True)
    try:
        r = subprocess.run(cmd, cwd=root, check=True, text=True,
                           stdout=subprocess.PIPE if capture else None)
    except subprocess.CalledProcessError as e:
        fail(f"{' '.join(cmd)} failed (exit {e.returncode})")
    return r.stdout


def target_dir(root):
    import json

    meta = cargo(root, "metadata", "--format-version", "1", "--no-deps", capture=True)
    return Path(json.loads(meta)["target_directory"])


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        root = workspace_root()
        # A relative CARGO_TARGET_DIR means the caller's folder, not the
        # workspace that cargo runs in.
        if os.environ.get("CARGO_TARGET_DIR"):
            os.environ["CARGO_TARGET_DIR"] = os.path.abspath(os.environ["CARGO_TARGET_DIR"])
        pkgs = []
        for pkg, *_ in ARTIFACTS:
            pkgs += ["-p", pkg]
        cargo(
            root, "build", "--release", *pkgs,
            "--config", "profile.release.debug=0",
            "--config", 'profile.release.strip="debuginfo"',
        )
        release = target_dir(root) / "release"
        pkg_dir = Path(self.build_lib) / "oxccl"
        for _, name, folder, dest in ARTIFACTS:
            src = release / name
            if not src.is_file():
                fail(f"cargo built no {src}")
            (pkg_dir / folder).mkdir(parents=True, exist_ok=True)
            out = pkg_dir / folder / dest
            shutil.copyfile(src, out)
            mode = 0o755 if folder == "bin" else 0o644
            os.chmod(out, mode | stat.S_IRUSR)
        (pkg_dir / "_build.py").write_text(
            '"""Written by setup.py when the wheel was built."""\n'
            f"VERSION = {workspace_version(root)!r}\n"
            f"COMMIT = {commit(root)!r}\n"
        )


class NativeDistribution(Distribution):
    """Native files: installed as platform files (the wheel's root is
    platlib, not purelib)."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-linux_<arch>: native files, no Python extension."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    version=workspace_version(workspace_root()),
    distclass=NativeDistribution,
    cmdclass={"build_py": BuildWithCargo, "bdist_wheel": PlatformWheel},
)
