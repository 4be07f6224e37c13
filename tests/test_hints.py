"""hint("name"): the next step each call, one step on demand, a clear word after the last and for a wrong name."""

from __future__ import annotations

import pytest

from course_utils.checks import hints
from course_utils.core.errors import CheckError


@pytest.fixture
def two_exercises(tmp_path, monkeypatch):
    (tmp_path / "00_demo.toml").write_text('[double]\nsteps = ["first", "second", "third"]\n'
                                           '[halve]\nsteps = ["only one"]\n', encoding="utf-8")
    read = hints.all_hints.__wrapped__  # the uncached reader
    monkeypatch.setattr(hints, "all_hints", lambda: read(tmp_path))
    monkeypatch.setattr(hints, "_shown", {})
    return tmp_path


def test_each_call_shows_the_next_step_then_says_it_was_the_last(two_exercises, capsys):
    for expected in ("Hint 1 of 3 for double", "Hint 2 of 3 for double", "Hint 3 of 3 for double (the last one)"):
        hints.hint("double")
        out = capsys.readouterr().out
        assert out.startswith(expected)
    assert "first" not in out and "third" in out, "one step at a time"
    hints.hint("double")
    assert "That was the last hint for double (3 of 3)" in capsys.readouterr().out


def test_a_step_can_be_shown_again_and_the_counters_are_per_exercise(two_exercises, capsys):
    hints.hint("double", 2)
    assert capsys.readouterr().out.endswith(":\nsecond\n")
    hints.hint("double")
    assert "Hint 3 of 3" in capsys.readouterr().out
    hints.hint("halve")
    assert "Hint 1 of 1 for halve (the last one):\nonly one" in capsys.readouterr().out


def test_a_wrong_name_or_step_says_what_is_expected(two_exercises):
    with pytest.raises(CheckError, match="no exercise of that name. Did you mean 'double'"):
        hints.hint("doubl")
    with pytest.raises(CheckError, match="hint\\(\\) lists them all"):
        hints.hint(42)
    with pytest.raises(CheckError, match="from 1 to 3"):
        hints.hint("double", 4)
    with pytest.raises(CheckError, match="from 1 to 3"):
        hints.hint("double", 0)


def test_hint_without_a_name_lists_the_exercises(two_exercises, capsys):
    hints.hint()
    assert "00_demo: double, halve" in capsys.readouterr().out


def test_a_file_without_steps_or_a_name_twice_is_refused(tmp_path):
    (tmp_path / "00_a.toml").write_text('[double]\nsteps = []\n', encoding="utf-8")
    with pytest.raises(ValueError, match="needs a non-empty list"):
        hints.all_hints.__wrapped__(tmp_path)
    (tmp_path / "00_a.toml").write_text('[double]\nsteps = ["x"]\n', encoding="utf-8")
    (tmp_path / "01_b.toml").write_text('[double]\nsteps = ["y"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="also in 00_a.toml"):
        hints.all_hints.__wrapped__(tmp_path)
