"""``setup()``: one call at the top of every notebook (introduced in notebook 00).

It fixes everything that would make two runs of a notebook print different
things: random seeds, the number of CPU threads, print options and the
figure style.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import matplotlib
import numpy as np
import torch

MATPLOTLIBRC = Path(__file__).with_name("matplotlibrc")


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
    from course_utils.errors import CheckError, InputError

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
