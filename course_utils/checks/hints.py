"""Hints in steps for every exercise: ``hint("masked_softmax")`` shows the next one.

A learner who is stuck asks for a hint by the exercise's name (the name of the
function the exercise asks for, which is also its nbgrader ``grade_id``). Each
call shows the next step, from a nudge towards the idea to a last hint that
stops just short of the solution; after the last one it says where else to look.
``hint(name, step)`` shows one step again, and ``hint()`` lists the exercises.

The hints themselves live in ``hint_texts/<notebook>.toml`` beside this
module, one file per notebook and one table per exercise::

    [masked_softmax]
    steps = ["a nudge towards the idea", "...", "the last step, just short of the solution"]

so that they are written once, and a test (tests/test_notebooks.py) checks
that every exercise has at least three and that none gives a line of the
solution away.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from course_utils.core.errors import CheckError

HINTS_DIR = Path(__file__).with_name("hint_texts")


@dataclass(frozen=True)
class Hints:
    """The hints of one exercise, in order."""

    name: str  # the exercise (function) name, e.g. "masked_softmax"
    notebook: str  # notebook stem, e.g. "00_orientation"
    steps: tuple[str, ...]


@cache
def all_hints(folder: Path = HINTS_DIR) -> dict[str, Hints]:
    """Every exercise's hints, read from ``hint_texts/*.toml``, by exercise name.

    Raises:
        ValueError: If a table has no steps, or two files define the same exercise.
    """
    found: dict[str, Hints] = {}
    for path in sorted(Path(folder).glob("*.toml")):
        with open(path, "rb") as f:
            table = tomllib.load(f)
        for name, entry in table.items():
            steps = tuple(s.strip() for s in entry.get("steps", ()))
            if not steps or not all(steps):
                raise ValueError(f"{path.name}: [{name}] needs a non-empty list of non-empty `steps`")
            if name in found:
                raise ValueError(f"{path.name}: [{name}] is also in {found[name].notebook}.toml")
            found[name] = Hints(name, path.stem, steps)
    return found


_shown: dict[str, int] = {}  # exercise -> how many steps this kernel has shown


def hint(name: str | None = None, step: int | None = None) -> None:
    """Print the next hint for exercise ``name`` (or hint number ``step``, counted from 1).

    Args:
        name: The exercise, i.e. the name of the function it asks you to write.
            Without it, the exercises that have hints are listed.
        step: Show this hint again instead of the next one.

    Raises:
        CheckError: If ``name`` is not an exercise or ``step`` is out of range.
    """
    hints = all_hints()
    if name is None:
        by_notebook: dict[str, list[str]] = {}
        for h in hints.values():
            by_notebook.setdefault(h.notebook, []).append(h.name)
        print("Exercises with hints (call hint(\"name\") for the next step):")
        for notebook, names in sorted(by_notebook.items()):
            print(f"  {notebook}: " + ", ".join(names))
        return
    if not isinstance(name, str) or name not in hints:
        close = [n for n in hints if isinstance(name, str) and (name.lower() in n or n in name.lower())]
        extra = f" Did you mean {', '.join(repr(n) for n in close)}?" if close else ""
        raise CheckError(f"hint({name!r}): no exercise of that name.{extra} The name is the function the exercise "
                         "asks you to write, in quotes; hint() lists them all.")
    total = len(hints[name].steps)
    if step is None:
        if _shown.get(name, 0) >= total:
            print(f"That was the last hint for {name} ({total} of {total}). Re-read the section the exercise "
                  "builds on, run your function on a tiny input and compare it with the formula by hand, "
                  f"or show a hint again with hint({name!r}, step).")
            return
        step = _shown.get(name, 0) + 1
    elif not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= total:
        raise CheckError(f"hint({name!r}, {step!r}): step must be a whole number from 1 to {total}.")
    _shown[name] = max(_shown.get(name, 0), step)
    more = "the last one" if step == total else f"call hint({name!r}) again for the next"
    print(f"Hint {step} of {total} for {name} ({more}):\n{hints[name].steps[step - 1]}")
