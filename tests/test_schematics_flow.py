"""The schematics module and the build-then-use helpers (checks.flow)."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib
import pytest
import torch

from course_utils.blocks import masks
from course_utils.checks import CheckError, answer_or_reference, check_padding_mask_for, compare_guess
from course_utils.core.errors import ExerciseOpen, InputError
from course_utils.experiments.schematics import KINDS, Schematic

matplotlib.use("Agg")


def _drawn() -> Schematic:
    s = Schematic(6, 3, title="lookup")
    s.tensor("q", 1, 1.5, "$q$", kind="query")
    s.box("score", 3, 1.5, "score")
    s.tensor("w", 5, 1.5, "weights", kind="weights", cells=5)
    s.arrow("q", "score", "compare")
    s.arrow("score", "w", bend=0.2, dashed=True, kind="weights")
    s.note(3, 0.4, "(B, T, S)")
    s.bracket(0.5, 5.5, 2.6, "one step")
    return s


def test_schematic_draws_labels_in_course_colours(tmp_path):
    s = _drawn()
    texts = [t.get_text() for t in s.ax.texts]
    for label in ("$q$", "score", "weights", "compare", "(B, T, S)", "one step"):
        assert label in texts
    assert s.ax.get_title() == "lookup"
    faces = {matplotlib.colors.to_hex(p.get_facecolor(), keep_alpha=False) for p in s.ax.patches}
    assert KINDS["query"].lower() in faces and KINDS["weights"].lower() in faces
    assert sum(type(p).__name__ == "FancyArrowPatch" for p in s.ax.patches) == 2
    assert tuple(s.figure.get_size_inches()) == (4.5, 2.25)
    s.figure.savefig(tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000


@pytest.mark.parametrize("build, words", [
    (lambda s: s.arrow("q", "nowhere"), "no node called 'nowhere'"),
    (lambda s: s.box("q", 1, 1, "again"), "already has a node called 'q'"),
    (lambda s: s.box("far", 9, 1, "out"), "outside"),
    (lambda s: s.tensor("t", 1, 1, "t", kind="colourful"), "unknown kind"),
    (lambda s: s.tensor("t", 1, 1, "t", cells=0), "cells must be"),
])
def test_schematic_bad_input_says_what_to_do(build, words):
    s = _drawn()
    with pytest.raises(InputError, match=words):
        build(s)
    with pytest.raises(InputError, match="width"):
        Schematic(0, 3)


def _open(lengths, scores):
    raise NotImplementedError()


def _right(lengths, scores):
    return (torch.arange(scores.shape[-1]) < lengths[:, None]).view(len(lengths), *[1] * (scores.dim() - 2), -1)


def _off_by_one(lengths, scores):
    return (torch.arange(scores.shape[-1]) <= lengths[:, None]).view(len(lengths), *[1] * (scores.dim() - 2), -1)


def test_open_exercise_fails_everywhere_a_learners_kernel_included(monkeypatch):
    import IPython

    with pytest.raises(ExerciseOpen, match="not written yet"):
        check_padding_mask_for(_open)
    # in a notebook kernel, as a learner or any grader runs it: the check still fails (grading fails closed)
    monkeypatch.setattr(IPython, "get_ipython", lambda: SimpleNamespace(kernel=object()))
    with pytest.raises(ExerciseOpen, match="(?s)Exercise still open.*not written yet.*raises-exception"):
        check_padding_mask_for(_open)
    with pytest.raises(CheckError, match="off by one"):  # a wrong answer fails too, with its bug named
        check_padding_mask_for(_off_by_one)


def test_a_failed_check_says_how_to_go_on():
    with pytest.raises(CheckError) as failed:
        check_padding_mask_for(_off_by_one)
    message = str(failed.value)
    assert message.index("off by one") < message.index('Stuck? `hint("_off_by_one")` shows the next hint')
    assert "Run All runs past this cell" in message and "use yours once it passes" in message
    with pytest.raises(CheckError) as again:  # said once, at the end, however deep the checker that failed
        check_padding_mask_for(_off_by_one)
    assert str(again.value).count("Stuck?") == 1
    # a pitfall's demonstration shows the bug only: the function shown is not the learner's
    from course_utils.checks import expect_failure

    assert "Stuck?" not in expect_failure(check_padding_mask_for, _off_by_one) and "off by one" in again.value.finding


def test_answer_or_reference_uses_the_answer_only_once_it_passes(capsys):
    assert answer_or_reference(_open, masks.padding_mask_for, check_padding_mask_for) is masks.padding_mask_for
    assert "not written yet" in capsys.readouterr().out
    assert answer_or_reference(_off_by_one, masks.padding_mask_for, check_padding_mask_for) is masks.padding_mask_for
    assert "does not pass its check yet" in capsys.readouterr().out
    assert answer_or_reference(_right, masks.padding_mask_for, check_padding_mask_for) is _right
    assert "uses your `_right`" in capsys.readouterr().out


def test_compare_guess(capsys):
    compare_guess(None, 0.25, "the weight")
    compare_guess(0.26, 0.25, "the weight")
    compare_guess(2.0, 0.25, "the weight")
    compare_guess("Keys", "keys")
    compare_guess(1e38, float("inf"), "exp(1000.0)")
    out = capsys.readouterr().out.splitlines()
    # no guess: nothing of the result is shown (a learner who runs first has not been told every answer)
    assert out[0] == ("You wrote no guess for the weight. Write it in the cell above, then run that cell "
                      "and this one again to see your guess beside the result.") and "0.25" not in out[0]
    assert out[1:] == ["You guessed 0.26; observed, the weight: 0.25 (within 10%).",
                       "You guessed 2; observed, the weight: 0.25.",
                       "You guessed 'Keys'; observed, the result: keys (right).",
                       "You guessed 1e+38; observed, exp(1000.0): inf."]
