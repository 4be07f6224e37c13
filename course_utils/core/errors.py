"""The exceptions the course raises on purpose (introduced in notebook 00).

* ``CheckError``: an exercise check failed. The message says what was expected,
  what came back and the likely bug.
* ``ExerciseOpen``: a ``CheckError`` for an exercise not written yet. Its check
  cell fails, under any grader, and Run All goes on past it (the cell is tagged
  ``raises-exception``).
* ``InputError``: a ``course_utils`` function got an input it cannot use (wrong
  shape, dtype, NaN, ``None``). The message says what was expected and what to
  look at, before anything deep inside PyTorch can fail.

In a notebook, ``setup()`` shows both as their message only, without library
frames; the cell still ends in an error.
"""

from __future__ import annotations


class CheckError(AssertionError):
    """A failed check. The message says what was expected, what came back and what to look at."""


class ExerciseOpen(CheckError):
    """A check met an exercise that is not written yet (its function still raises ``NotImplementedError``)."""


class InputError(ValueError):
    """Bad input to a course_utils function: what was expected, what came, what to look at."""
