"""Tests for course_utils.experiments.data: vocabularies, generators, files and batching."""

import datetime as dt
import re

import pytest
import torch

from course_utils.experiments.data import (
    DATE_FORMAT_EXAMPLES,
    MONTHS,
    Vocab,
    date_vocabs,
    iter_batches,
    load_pairs,
    make_batch,
    make_date_pairs,
    make_reversal_pairs,
    make_reversal_test_pairs,
    reversal_vocab,
    save_pairs,
)


def test_vocab_specials_and_roundtrip():
    vocab = reversal_vocab(10)
    assert vocab.itos[:3] == ("<pad>", "<sos>", "<eos>")
    assert (vocab.pad_id, vocab.sos_id, vocab.eos_id) == (0, 1, 2)
    assert len(vocab) == 13
    ids = vocab.encode("jab", add_sos=True, add_eos=True)
    assert ids == [1, vocab.stoi["j"], vocab.stoi["a"], vocab.stoi["b"], 2]
    assert vocab.decode(ids) == "jab"
    assert vocab.decode([3, 4, 2, 5, 6]) == "ab"  # stops at <eos>
    assert vocab.decode(torch.tensor([3, 0, 4])) == "ab"  # skips <pad>


def test_vocab_rejects_bad_itos():
    with pytest.raises(ValueError):
        Vocab(("a", "<pad>", "<sos>", "<eos>"))
    with pytest.raises(ValueError):
        Vocab.from_symbols("aa")


def test_reversal_is_deterministic_and_reversed():
    a = make_reversal_pairs(200, 3, 20, n_symbols=10, seed=7)
    b = make_reversal_pairs(200, 3, 20, n_symbols=10, seed=7)
    c = make_reversal_pairs(200, 3, 20, n_symbols=10, seed=8)
    assert a == b
    assert a != c
    lengths = {len(s) for s, _ in a}
    assert min(lengths) == 3 and max(lengths) == 20
    allowed = set("abcdefghij")
    for src, tgt in a:
        assert tgt == src[::-1]
        assert set(src) <= allowed


def test_reversal_test_set_has_every_length():
    pairs = make_reversal_test_pairs(per_length=5, min_len=3, max_len=20, n_symbols=10)
    counts = {}
    for src, _ in pairs:
        counts[len(src)] = counts.get(len(src), 0) + 1
    assert counts == {length: 5 for length in range(3, 21)}


def test_dates_are_deterministic_valid_and_match_source():
    pairs = make_date_pairs(400, seed=3)
    assert pairs == make_date_pairs(400, seed=3)
    assert pairs != make_date_pairs(400, seed=4)
    src_vocab, tgt_vocab = date_vocabs()
    month_number = {m: i + 1 for i, m in enumerate(MONTHS)}
    month_number.update({m[:3]: i + 1 for i, m in enumerate(MONTHS)})
    seen_formats = set()
    for src, tgt in pairs:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", tgt)
        d = dt.date.fromisoformat(tgt)  # raises if not a real date
        src_vocab.encode(src)  # every character is in the vocabulary
        tgt_vocab.encode(tgt)
        # The source mentions the same year, day and month.
        numbers = [int(x) for x in re.findall(r"\d+", src)]
        assert d.year in numbers and d.day in numbers
        words = [w.lower() for w in re.findall(r"[A-Za-z]+", src)]
        months = [month_number[w] for w in words if w in month_number]
        assert months == [d.month] or (not months and d.month in numbers)
        seen_formats.add(re.sub(r"[a-z]", "a", re.sub(r"\d", "9", src.lower())))
    assert len(seen_formats) > len(DATE_FORMAT_EXAMPLES)  # all formats occur (some in several widths)


def test_date_example_formats():
    assert DATE_FORMAT_EXAMPLES[:4] == ("21 nov 2026", "november 21, 2026", "21/11/2026", "Sat 21 November 2026")


def test_tsv_roundtrip(tmp_path):
    pairs = make_date_pairs(50, seed=0) + make_reversal_pairs(50, seed=0)
    path = tmp_path / "split.tsv"
    save_pairs(pairs, path)
    assert path.read_text(encoding="utf-8").splitlines()[0] == "source\ttarget"
    assert load_pairs(path) == pairs
    with pytest.raises(ValueError):
        save_pairs([("a\tb", "c")], tmp_path / "bad.tsv")


def test_make_batch_shapes_and_padding():
    vocab = reversal_vocab(10)
    pairs = [("abc", "cba"), ("abcdefg", "gfedcba"), ("j", "j")]
    batch = make_batch(pairs, vocab, vocab)
    assert batch.src.shape == (3, 7) and batch.src.dtype == torch.long
    assert batch.tgt_in.shape == batch.tgt_out.shape == (3, 8)
    assert batch.src_lengths.tolist() == [3, 7, 1]
    assert batch.tgt_lengths.tolist() == [4, 8, 2]
    assert batch.src[0].tolist() == vocab.encode("abc") + [0, 0, 0, 0]
    assert batch.tgt_in[0].tolist() == [1, *vocab.encode("cba"), 0, 0, 0, 0]
    assert batch.tgt_out[0].tolist() == [*vocab.encode("cba"), 2, 0, 0, 0, 0]
    assert ((batch.src != 0).sum(1) == batch.src_lengths).all()


def test_select_and_iter_batches_trim():
    vocab = reversal_vocab(10)
    pairs = [("ab", "ba"), ("abcdef", "fedcba"), ("abc", "cba"), ("a", "a")]
    batch = make_batch(pairs, vocab, vocab)
    sub = batch.select(torch.tensor([0, 2]))
    assert sub.src.shape == (2, 3) and sub.tgt_in.shape == (2, 4)
    chunks = list(iter_batches(batch, 3))
    assert [len(c) for c in chunks] == [3, 1]
    assert chunks[1].src.shape == (1, 1)


def test_committed_splits_are_reproduced_exactly_and_match_the_readme(tmp_path):
    """data/*.tsv = a fresh generation, byte for byte; the README lists their sha256 and sizes."""
    import hashlib
    import re

    from course_utils.experiments.data import DATA_DIR
    from course_utils.experiments.training import write_splits

    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    written = write_splits(tmp_path)
    assert len(written) == 4
    for fresh in written:
        committed = DATA_DIR / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), f"{fresh.name} differs from a fresh generation: run make data"
        digest = hashlib.sha256(committed.read_bytes()).hexdigest()
        row = re.search(rf"^\| `{re.escape(fresh.name)}` \| ([\d,]+) \| ([\d,]+) \| `([0-9a-f]{{64}})` \|", readme, re.M)
        assert row, f"data/README.md has no row for {fresh.name}"
        n_pairs = len(committed.read_text(encoding="utf-8").splitlines()) - 1
        assert (int(row[1].replace(",", "")), int(row[2].replace(",", "")), row[3]) == (
            n_pairs, committed.stat().st_size, digest)


def test_load_splits_match_the_default_configs():
    from course_utils.blocks.seq2seq import Seq2SeqConfig
    from course_utils.experiments.training import load_splits, make_task

    for task in ("reversal", "dates"):
        train_pairs, test_pairs, _, _ = make_task(Seq2SeqConfig(task=task))
        assert load_splits(task) == (train_pairs, test_pairs)
    with pytest.raises(ValueError, match="task must be one of"):
        load_splits("nope")
