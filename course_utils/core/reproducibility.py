"""``setup()``: one call at the top of every notebook (introduced in notebook 00).

It fixes everything that would make two runs of a notebook print different
things: random seeds, the number of CPU threads, print options and the
figure style. It also says so when the kernel lacks the pinned CPU code paths
of ``course_utils.core.portable``, without which the last digits can differ from
the committed outputs.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import matplotlib
import numpy as np
import torch

from course_utils.core import portable

MATPLOTLIBRC = Path(__file__).resolve().parents[1] / "matplotlibrc"


def setup(seed: int = 0, threads: int = 1, precision: int = 4) -> None:
    """Seed every generator, fix the thread count and print options, load the figure style.

    Args:
        seed: Seed for Python's ``random``, NumPy's global generator and torch.
        threads: Number of intra-op CPU threads for torch. A fixed number makes
            float sums (and so printed results) identical run after run,
            whatever ``OMP_NUM_THREADS`` says. 1 is fastest for the small
            models in this course and leaves the other core to a second
            notebook when the tests run two at a time.
        precision: Decimal places when printing tensors and arrays.

    Raises:
        ValueError: If ``seed`` is not a non-negative int or ``threads`` < 1.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"setup(seed=...) expects a non-negative int, got {seed!r}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"setup(threads=...) expects an int >= 1, got {threads!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses started later
    torch.set_printoptions(precision=precision, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=precision, suppress=True, linewidth=100)
    _inline_figures()
    _short_check_errors()
    matplotlib.rc_file(MATPLOTLIBRC)  # after the inline backend, which sets its own defaults
    if not portable.pinned():
        print(UNPINNED_NOTE, file=sys.stderr)


def error_bound(error, tol: float = 1e-5) -> str:
    """A float error as the claim it supports: ``"< 1e-05"`` when it is below ``tol``, else its value.

    The digits of a rounding error differ from one CPU's code path to another's
    (``4.3e-07`` here, ``4.0e-07`` there); whether it stays below the tolerance
    does not, so that is what a notebook prints. Above ``tol`` the value itself
    is printed, so a real difference shows (and the cell's assert fails).

    Args:
        error: A non-negative float, or a one-element tensor (detached here).
        tol: The bound to state, 1e-5 by default (float32 parity).
    """
    error = float(error.detach()) if hasattr(error, "detach") else float(error)
    if error != error or error < 0:
        raise ValueError(f"error_bound expects an error >= 0, got {error!r}")
    return f"< {tol:.0e}" if error < tol else f"{error:.2e}"


UNPINNED_NOTE = (
    "Note: this kernel does not run with the course's pinned CPU settings (course_utils.core.portable), "
    "so trained models and printed floats may differ in their last digits from the committed notebook. "
    "On x86-64 Linux, `make lab` starts a kernel that has them; elsewhere the asserts still hold.")


def _short_check_errors() -> None:
    """In a notebook, show a failed check or a rejected input as its message, without library frames.

    The cell still ends in an error (so a graded test cell scores 0); only the
    display is shortened to what the learner needs: what was expected, what
    came back, what to look at.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from course_utils.core.errors import CheckError, InputError

    def show(shell, etype, value, tb, tb_offset=None):  # noqa: ARG001 - IPython's handler signature
        short = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"]
        shell._showtraceback(etype, value, short)  # sends the error output (ename, evalue, this traceback)
        return short

    shell.set_custom_exc((CheckError, InputError), show)


def _inline_figures() -> None:
    """In a notebook, show returned Figures as PNG (never SVG: its random ids break nbval)."""
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: nothing to display
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    shell.run_line_magic("matplotlib", "inline")
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    set_matplotlib_formats("png")
