"""Build, then use: how a notebook goes on after an exercise (introduced in notebook 00).

Three pieces, used from the notebooks' cells:

* ``@exercise_check`` marks an exercise's checker. An exercise that is not
  written yet (its function still raises ``NotImplementedError``) fails its
  check with ``ExerciseOpen``, everywhere: in a learner's kernel, under the
  course's grading, under plain nbgrader or any other grader. Grading fails
  closed, because nothing here asks who is running the notebook. Run All still
  goes to the end: every graded check cell carries the ``raises-exception``
  tag, which JupyterLab, nbclient and nbgrader honour by running on past that
  cell's error (the error still costs the exercise its points), and the cell
  after it goes on with the course's version.
* ``answer_or_reference(fn, reference, check)`` is the cell after an exercise:
  it gives back the learner's function once it passes its check, and the
  course's reference until then, and says which one the notebook now uses.
* ``show_model_answer(notebook, question)`` follows each written question in a
  self-study copy (``make lab``): once the learner's answer is written and
  saved, it shows the model answer and its rubric. The graded release has
  neither the cell nor the answers.
* ``compare_guess(guess, observed)`` ends a prediction: the learner writes a
  guess in the cell before, this prints it beside what was observed (not graded;
  without a guess, it prints nothing of the result itself).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from course_utils.core.errors import CheckError, ExerciseOpen

F = TypeVar("F", bound=Callable[..., Any])

WRITTEN_STUB = "YOUR ANSWER HERE"  # what nbgrader's release puts in a written-answer cell
MODEL_ANSWERS = ".model_answers"  # beside a self-study copy's notebooks: <notebook>.json, {question: answer and rubric}

_DEPTH: ContextVar[int] = ContextVar("_DEPTH", default=0)
_PASSED: dict[str, int] = {}  # checker name -> id() of the last function that passed it


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _going_on(fn: Any) -> str:
    """What a learner whose answer fails can do next (the end of every failed check's message)."""
    name = getattr(fn, "__name__", None)
    stuck = f'`hint("{name}")` shows the next hint' if isinstance(name, str) and name.isidentifier() else \
        "`hint()` lists the hints"
    return (f"Stuck? {stuck}. Meanwhile the notebook goes on with the course's version: Run All runs past this cell, "
            "and the cells after it use yours once it passes.")


def exercise_check(check: F) -> F:
    """Mark ``check`` as an exercise's checker (first argument: the learner's function or module).

    Only the outermost call decides: a checker that calls another one lets the
    inner one's failure through. On success, the function is remembered as
    having passed, for :func:`answer_or_reference`.
    """

    @functools.wraps(check)
    def wrapper(fn: Any = None, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841
        token = _DEPTH.set(_DEPTH.get() + 1)
        try:
            result = check(fn, *args, **kwargs)
        except ExerciseOpen as exc:
            if _DEPTH.get() > 1:
                raise
            raise ExerciseOpen(f"Exercise still open. {exc}\n  Run All goes on past this cell (it is tagged "
                               "raises-exception), on the course's version. Run it again once you have written yours."
                               ) from None
        except CheckError as exc:
            if _DEPTH.get() > 1 or type(exc) is not CheckError:
                raise
            failed = CheckError(f"{exc}\n  {_going_on(fn)}")
            failed.finding = str(exc)  # what the check found, for expect_failure's demonstrations
            raise failed from None
        finally:
            _DEPTH.reset(token)
        _PASSED[check.__name__] = id(fn)
        return result

    return wrapper  # type: ignore[return-value]


def answer_or_reference(fn: Any, reference: Any, check: Callable[..., Any]) -> Any:
    """The learner's ``fn`` if it passes ``check``, else the course's ``reference``; says which.

    Args:
        fn: The learner's function (or module class) from the exercise cell.
        reference: The course's implementation of the same thing.
        check: The exercise's checker (marked with ``@exercise_check``).

    Returns:
        ``fn`` or ``reference``; the cells after it run on what it returns.
    """
    name = _name(fn)
    where = f"{reference.__module__}.{reference.__qualname__}"
    if _PASSED.get(getattr(check, "__name__", "")) != id(fn):
        try:
            token = _DEPTH.set(_DEPTH.get() + 1)  # run as an inner check: failures come back here
            try:
                check(fn)
            finally:
                _DEPTH.reset(token)
        except ExerciseOpen:
            print(f"○ `{name}` is not written yet, so from here on the notebook uses the course's `{where}`.")
            return reference
        except CheckError as exc:
            first = str(exc).strip().splitlines()[0]
            print(f"✗ `{name}` does not pass its check yet ({first[:160]}).\n"
                  f"  From here on the notebook uses the course's `{where}`; run the exercise again once it passes.")
            return reference
        _PASSED[check.__name__] = id(fn)
    print(f"✓ From here on the notebook uses your `{name}`.")
    return fn


def compare_guess(guess: Any, observed: Any, what: str = "the result") -> None:
    """Print the learner's guess beside what was observed (a prediction, not graded).

    Without a guess it shows nothing of the result: a learner who runs the
    notebook first, as most do, has not been told the answer of every prediction.

    Args:
        guess: What the learner wrote before running the experiment (``None`` if nothing).
        observed: What the experiment gave (a number, a string or anything printable).
        what: A few words naming the quantity, for the sentence.
    """
    shown = f"{observed:.3g}" if isinstance(observed, float) else str(observed)
    if guess is None or guess == "" or guess is Ellipsis:
        print(f"You wrote no guess for {what}. Write it in the cell above, then run that cell and this one "
              "again to see your guess beside the result.")
        return
    if isinstance(guess, (int, float)) and isinstance(observed, (int, float)) and not isinstance(guess, bool):
        close = math.isfinite(observed) and abs(guess - observed) <= 0.1 * abs(observed)
        print(f"You guessed {guess:g}; observed, {what}: {shown}" + (" (within 10%)." if close else "."))
        return
    same = str(guess).strip().lower() == str(observed).strip().lower()
    print(f"You guessed {guess!r}; observed, {what}: {shown}" + (" (right)." if same else "."))


def _saved_answer(notebook: str, question: str) -> str | None:
    """The learner's saved text for ``question`` ("" while unwritten), or None when the notebook's file is not found."""
    session = os.environ.get("JPY_SESSION_NAME", "")  # JupyterLab tells the kernel its notebook's path
    here = Path.cwd()
    candidates = [Path(session), here / session, here / Path(session).name] if session else []
    for path in [*candidates, here / f"{notebook}.ipynb"]:
        if path.name != f"{notebook}.ipynb" or not path.is_file():
            continue
        try:
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == question:
                text = "".join(cell.get("source", ""))
                return "" if text.strip() in ("", WRITTEN_STUB) else text
    return None


def show_model_answer(notebook: str, question: str) -> None:
    """Self-study: a written question's model answer and rubric, shown once the learner's answer is saved.

    Args:
        notebook: The notebook's name without ``.ipynb`` ("00_orientation").
        question: The written question's nbgrader ``grade_id`` ("written_...").
    """
    answers_file = Path.cwd() / MODEL_ANSWERS / f"{notebook}.json"
    try:
        model = json.loads(answers_file.read_text(encoding="utf-8"))[question]
    except (OSError, ValueError, KeyError):
        print(f"No model answer for {question} beside this notebook (looked in {answers_file}). `make lab` "
              "writes them beside your copy; the graded release has none.")
        return
    answer = _saved_answer(notebook, question)
    if answer is None:
        print(f"Could not find {notebook}.ipynb in this folder to read your answer. Write and save it, then "
              "compare it with the model answer and rubric in the file " + str(answers_file) + ".")
        return
    if not answer:
        print("Write your answer in the cell above first, and save the notebook (Ctrl+S). Then run this cell "
              "again: it shows the model answer and the rubric a marker uses, to compare with yours.")
        return
    from IPython.display import Markdown, display

    display(Markdown(model))
