"""One arithmetic on every x86-64 machine: the settings that make notebook outputs portable.

Float results depend on which code path a library picks for the CPU it runs
on: ATen's vectorised kernels (AVX2 or AVX-512), MKL's matrix products and
vector maths (different code for Intel and AMD), oneDNN, OpenBLAS (used by
NumPy, SciPy and gensim) and NumPy's own SIMD loops. Training turns a
difference in the last bit into a different accuracy. Each setting below
fixes one of those choices to a path that every x86-64 CPU with AVX2 can run,
so that a learner's laptop, a lecturer's CI runner and the machine that
executed the committed notebooks take the same code path wherever a library
lets us choose it. MKL does not fully let us (see ``OTHER_MKL_PATH``).

The settings must be in a process's environment before the library starts
(NumPy reads its variable when it is imported), so they are given to every
kernel the course starts: ``make execute``, ``make test``, ``make bench``,
grading, and the kernel that ``make lab`` opens (``install_kernel``).
``import course_utils`` also puts the torch settings in place when it runs
before torch has computed anything, which covers a kernel started elsewhere.

Not every machine can match: on ARM or macOS the libraries are different
builds, and ``platform_matches()`` is False there. ``make test`` then runs the
notebooks checking their asserts without comparing outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

# What each setting changes (measured with torch 2.13.0; see the README's Tests section).
PINNED_ENV: dict[str, str] = {
    # ATen's vectorised kernels (sums, softmax, exp, ...): AVX2, even where AVX-512 exists.
    "ATEN_CPU_CAPABILITY": "avx2",
    # MKL's code path for matrix products and vector maths: AVX2 on Intel CPUs with AVX-512 too.
    # MKL still takes its own paths on AMD (exp, log, some products): see OTHER_MKL_PATH.
    "MKL_CBWR": "AVX2",
    # oneDNN's instruction set, capped at AVX2.
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # OpenBLAS (NumPy, SciPy, gensim's Word2Vec): Haswell kernels on every CPU.
    "OPENBLAS_CORETYPE": "Haswell",
    # NumPy's SIMD loops: no AVX-512 variants (its AVX-512 exp and log differ).
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
}

# What the pins cannot fix. MKL chooses code by CPU vendor and generation even under a pinned
# branch (measured: torch.exp and torch.log differ between an Intel and an AMD CPU with
# MKL_CBWR=AVX2). "COMPATIBLE" would make them agree but trains 2.5-3 times slower (notebook 07:
# 210 s instead of 84 s). So outputs that go through training, where a last-bit difference
# grows, are not compared by nbval; their cells assert their claims with a margin instead.
# `make test-cpus` runs every notebook with MKL on this other path and compares the rest.
OTHER_MKL_PATH: dict[str, str] = {"MKL_CBWR": "COMPATIBLE"}

KERNEL_NAME = "python3"


def platform_matches() -> bool:
    """True on x86-64 Linux with AVX2 and FMA: where the committed outputs reproduce bit for bit."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx2" in flags and "fma" in flags


def describe_platform() -> str:
    """One line naming this machine's OS, architecture and whether outputs are compared."""
    where = f"{platform.system()} {platform.machine()}"
    if platform_matches():
        return f"{where} with AVX2: notebook outputs are compared with the committed ones (strict nbval)"
    return (f"{where}: the committed outputs were computed on x86-64 Linux with AVX2 and cannot match "
            "here to the last digit, so the notebooks are run and their asserts checked, "
            "but their outputs are not compared")


def pin_environment(environ: dict | None = None) -> dict:
    """Put the pinned settings into ``environ`` (default: this process's), unless already set.

    A value already there wins, so a check can ask for another code path on purpose
    (``make test-cpus`` does). Nothing is set where the platform cannot match.
    Returns the environment.
    """
    environ = os.environ if environ is None else environ
    if platform_matches():
        for key, value in PINNED_ENV.items():
            environ.setdefault(key, value)
    return environ


def pinned() -> bool:
    """True when every pinned setting is in this process's environment (a deliberately different value counts).

    ``setup()`` warns when this is False: the kernel was started without the course's
    settings, so its last digits can differ from the committed outputs.
    """
    return platform_matches() and all(key in os.environ for key in PINNED_ENV)


def kernel_spec() -> dict:
    """The Jupyter kernel spec of the course: ipykernel's own, with the pinned settings in its environment."""
    return {
        # "python" is replaced by the environment's interpreter, as in ipykernel's spec.
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "metadata": {"debugger": True},
        "kernel_protocol_version": "5.5",
        "env": dict(PINNED_ENV) if platform_matches() else {},
    }


def install_kernel(prefix: str = sys.prefix) -> Path:
    """Write the course's kernel spec into ``prefix`` (the virtual environment), replacing ipykernel's.

    JupyterLab started from that environment (``make lab``) then runs every
    notebook with the pinned settings, so a learner sees the committed numbers.
    """
    folder = Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kernel.json"
    path.write_text(json.dumps(kernel_spec(), indent=1) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install-kernel", action="store_true", help="write the pinned kernel spec into this environment")
    parser.add_argument("--describe", action="store_true", help="print what is compared on this platform")
    args = parser.parse_args(argv)
    if args.install_kernel:
        print(f"kernel spec with pinned settings: {install_kernel()}")
    if args.describe or not args.install_kernel:
        print(describe_platform())
    return 0


if __name__ == "__main__":
    sys.exit(main())
