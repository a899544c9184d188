"""The wheel is the workbook: code, the C kernel's binary for one platform, and the workbook's own files.

What a wheel holds beyond the Python code (build_py below):
  lessonkit/workbook/{data,notebooks,docs,tests/schemas}   copied from the repository (lessonkit.files.resources
                                                           finds them there; in a clone it finds them beside it)
  lessonkit/engine/kernels/rowkernel-<os>-<arch>.<ext>     the kernel for the wheel's platform only (a plain C
                                                           library loaded with ctypes: no Python ABI, so one
                                                           binary serves every CPython version)

Tags (bdist_wheel below): py3-none-<platform>. The platform is the host's unless `--plat-name` says another,
e.g. `pip wheel . -C--build-option=--plat-name=win_amd64` or `python -m build -w -C--build-option=...`; a Linux
wheel says manylinux2014 (glibc 2.17: the binaries are cross-built against it, `auditwheel show` checks).
`csrc/build_kernels.py` cross-builds the six shipped binaries with zig; for a platform without one, the build
runs `csrc/build_kernels.py --host` (needs a C compiler) and the wheel takes that.

An editable install (`pip install -e .`, what ./workbook does) copies nothing: the package reads the clone."""
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
WORKBOOK_PARTS = ("data", "notebooks", "docs", "tests/schemas")     # = lessonkit.files.resources.WORKBOOK_PARTS
KERNELS = Path("lessonkit") / "engine" / "kernels"

# wheel platform tag -> (os, arch) of the kernel binary it carries
PLATFORMS = {
    "manylinux_2_17_x86_64.manylinux2014_x86_64": ("linux", "x86_64"),
    "manylinux_2_17_aarch64.manylinux2014_aarch64": ("linux", "aarch64"),
    "win_amd64": ("windows", "x86_64"),
    "win_arm64": ("windows", "aarch64"),
    "macosx_11_0_x86_64": ("macos", "x86_64"),
    "macosx_11_0_arm64": ("macos", "arm64"),
}
ALIASES = {"linux_x86_64": "manylinux_2_17_x86_64.manylinux2014_x86_64",
           "linux_aarch64": "manylinux_2_17_aarch64.manylinux2014_aarch64"}


def host_platform() -> str:
    """The wheel tag of this machine, in PLATFORMS' spelling."""
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if sys.platform.startswith("linux"):
        return ALIASES.get(f"linux_{arch}", f"linux_{arch}")
    if sys.platform == "win32":
        return {"x86_64": "win_amd64", "aarch64": "win_arm64"}.get(arch, f"win_{arch}")
    if sys.platform == "darwin":
        return f"macosx_11_0_{'arm64' if arch == 'aarch64' else arch}"
    return f"{sys.platform}_{arch}"


def wheel_platform(plat_name: str | None) -> str:
    name = (plat_name or os.environ.get("LESSONKIT_WHEEL_PLATFORM") or host_platform()).replace("-", "_").replace(".", "_")
    for tag in PLATFORMS:
        if name == tag.replace(".", "_") or name in tag.replace(".", "_").split("_manylinux"):
            return tag
    return ALIASES.get(name, name)


def kernel_binary(tag: str) -> Path | None:
    """The shipped binary for a wheel tag; for the host's tag without one, a host build (csrc/build_kernels.py
    --host, which needs a C compiler); None when there is neither (the wheel then runs on the MKL path)."""
    if tag in PLATFORMS:
        os_name, arch = PLATFORMS[tag]
        found = sorted((ROOT / KERNELS).glob(f"rowkernel-{os_name}-{arch}.*"))
        if found:
            return found[0]
    if tag != wheel_platform(None) or not (ROOT / "csrc" / "build_kernels.py").is_file():
        return None
    r = subprocess.run([sys.executable, str(ROOT / "csrc" / "build_kernels.py"), "--host"], cwd=ROOT)
    host = sorted((ROOT / KERNELS).glob("rowkernel-host.*"))
    return host[0] if r.returncode == 0 and host else None


class BuildPy(build_py):
    """Copies the workbook's files into the package, and keeps only the wheel platform's kernel binary."""

    plat_name = None

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "lessonkit" / "workbook"
        for part in WORKBOOK_PARTS:
            src = ROOT / part
            if not src.is_dir():
                raise SystemExit(f"setup.py: the workbook's {part}/ is missing from {ROOT} (a partial checkout?)")
            shutil.copytree(src, dest / part, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
        kernels = Path(self.build_lib) / KERNELS
        keep = kernel_binary(wheel_platform(BuildPy.plat_name))
        if kernels.is_dir():
            for p in kernels.glob("rowkernel-*"):
                if keep is None or p.name != keep.name:
                    p.unlink()
        if keep is not None:
            kernels.mkdir(parents=True, exist_ok=True)
            shutil.copy2(keep, kernels / keep.name)


class BdistWheel(bdist_wheel):
    """py3-none-<platform>: no Python ABI (the kernel is loaded with ctypes), one platform's binary."""

    def finalize_options(self):
        BuildPy.plat_name = self.plat_name
        super().finalize_options()

    def get_tag(self):
        return "py3", "none", wheel_platform(self.plat_name if self.plat_name_supplied else None)


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
