"""A stand-in for another CPU, on one machine: ``make test-cpus`` (CI runs it after ``make test``).

The committed outputs must reproduce on every x86-64 Linux machine with AVX2,
Intel or AMD. ``course_utils/core/portable.py`` pins every library's code path
that can be pinned. One cannot be pinned without a large slowdown: MKL picks
its own code by CPU vendor and generation (exp, log, some matrix products).
So another CPU is, to these notebooks, this machine with MKL on another code
path, and that is what this check runs: every lecture under strict nbval (the lab book: run it by hand, see README),
in kernels whose MKL takes the ``COMPATIBLE`` path instead of ``AVX2``.

Every output nbval compares must come out the same there; outputs that go
through training are tagged ``nbval-ignore-output`` and their cells assert
their claims with a margin, which must hold there too. The first test shows
that the other path really computes different bits, so this check can fail:
the notebooks committed before the pins (which compared training curves and
printed float errors to their last digits) fail it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.core.portable import OTHER_MKL_PATH, PINNED_ENV, platform_matches

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OTHER_CPU = {**PINNED_ENV, **OTHER_MKL_PATH}

PROBE = """
import hashlib, torch
torch.set_num_threads(1); torch.manual_seed(0)
a, b = torch.randn(64, 128), torch.randn(128, 96)
gru = torch.nn.GRU(16, 32, batch_first=True)
out, _ = gru(torch.randn(4, 10, 16)); out.sum().backward()
x = torch.randn(1000)
for name, t in [("matmul", a @ b), ("GRU gradient", gru.weight_hh_l0.grad), ("exp", torch.exp(x)), ("log", torch.log(x.abs()))]:
    print(name, hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()[:16])
"""


def environment(settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_ENV}
    env.update(settings)
    return env


@pytest.fixture(scope="module", autouse=True)
def requirements():
    if not platform_matches():
        pytest.fail("the CPU stand-in needs x86-64 Linux with AVX2, the platform whose outputs are committed")


def probe(settings: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", PROBE], env=environment(settings), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())


def test_the_other_mkl_path_computes_different_bits():
    pinned, other = probe(PINNED_ENV), probe(OTHER_CPU)
    different = [name for name in pinned if pinned[name] != other[name]]
    assert "matmul" in different and "GRU gradient" in different, (
        f"MKL_CBWR={OTHER_MKL_PATH['MKL_CBWR']} should change matrix products here; it changed only {different}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_compared_outputs_are_the_same_on_the_other_path(path):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               str(path.relative_to(ROOT))]
    done = subprocess.run(command, cwd=ROOT, env=environment(OTHER_CPU), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{path.name} with MKL on another code path:\n{done.stdout[-8000:]}"
