"""Toy sequence-to-sequence data sets, vocabularies and batching.

Two character-level tasks, both generated deterministically from a seed (no
downloads):

* **Reversal**: the source is a random string of symbols, the target is the
  same string reversed (``"abcd" -> "dcba"``). Output position ``i`` needs
  source position ``L - 1 - i``: an alignment that is simple to state but
  forces a fixed-size context vector to remember the *whole* input.
* **Dates**: a human-readable date in one of several formats
  (``"21 nov 2026"``, ``"november 21, 2026"``, ``"21/11/2026"``,
  ``"Sat 21 November 2026"``, ...) becomes the ISO date ``"2026-11-21"``.
  The year moves to the front, so the alignment reorders.

A data set is a list of ``(source, target)`` string pairs. A :class:`Vocab`
maps characters to integer ids; :func:`make_batch` turns pairs into padded
``LongTensor`` s.

Dimension letters used in shapes: ``B`` batch, ``S`` source length,
``T`` target length (including ``<sos>`` or ``<eos>``), ``N`` number of pairs.
"""

from __future__ import annotations

import csv
import itertools
import datetime as _dt
import string
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
"""The repository's data folder (committed splits and their README)."""

Pair = tuple[str, str]
"""A ``(source, target)`` example. Both are plain strings, one token per character."""

PAD, SOS, EOS = "<pad>", "<sos>", "<eos>"
"""Special tokens; their ids are always 0, 1 and 2 in every :class:`Vocab`."""

REVERSAL_ALPHABET = string.ascii_lowercase
"""The reversal task uses the first ``n_symbols`` of these letters."""

DATE_SOURCE_ALPHABET = " ,/." + string.digits + string.ascii_lowercase + string.ascii_uppercase
"""Every character that can occur in a human-readable date source."""

DATE_TARGET_ALPHABET = "-" + string.digits
"""Every character that can occur in an ISO date ``YYYY-MM-DD``."""

MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Vocab:
    """A character vocabulary with ``<pad>=0``, ``<sos>=1``, ``<eos>=2``.

    Build it with :meth:`from_symbols`; ``itos[i]`` is the token with id
    ``i`` and ``stoi`` is the inverse mapping.

    Attributes:
        itos: Tokens in id order; the first three are the special tokens.
        stoi: Token -> id (derived from ``itos``).
    """

    itos: tuple[str, ...]
    stoi: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.itos[:3] != (PAD, SOS, EOS):
            raise ValueError(f"itos must start with {(PAD, SOS, EOS)}, got {self.itos[:3]}")
        if len(set(self.itos)) != len(self.itos):
            raise ValueError("duplicate tokens in itos")
        object.__setattr__(self, "stoi", {tok: i for i, tok in enumerate(self.itos)})

    @classmethod
    def from_symbols(cls, symbols: Iterable[str]) -> Vocab:
        """Vocabulary of the special tokens followed by ``symbols`` (one char each)."""
        return cls((PAD, SOS, EOS, *symbols))

    pad_id: ClassVar[int] = 0
    sos_id: ClassVar[int] = 1
    eos_id: ClassVar[int] = 2

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, add_sos: bool = False, add_eos: bool = False) -> list[int]:
        """Map a string to ids, one per character.

        Args:
            text: The string to encode; every character must be in the vocabulary.
            add_sos: Prepend ``<sos>``.
            add_eos: Append ``<eos>``.

        Returns:
            ``len(text) + add_sos + add_eos`` ids.
        """
        ids = [self.stoi[ch] for ch in text]
        if add_sos:
            ids.insert(0, self.sos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """Map ids back to a string, stopping at the first ``<eos>``.

        ``<pad>`` and ``<sos>`` are skipped.

        Args:
            ids: A sequence of ids, or a 1-D tensor of shape ``(T,)``.
        """
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.sos_id):
                continue
            out.append(self.itos[i])
        return "".join(out)


def reversal_vocab(n_symbols: int = 10) -> Vocab:
    """Vocabulary for the reversal task: specials + the first ``n_symbols`` letters."""
    if not 1 <= n_symbols <= len(REVERSAL_ALPHABET):
        raise ValueError(f"n_symbols must be in [1, {len(REVERSAL_ALPHABET)}]")
    return Vocab.from_symbols(REVERSAL_ALPHABET[:n_symbols])


def date_vocabs() -> tuple[Vocab, Vocab]:
    """``(source_vocab, target_vocab)`` for the dates task."""
    return Vocab.from_symbols(DATE_SOURCE_ALPHABET), Vocab.from_symbols(DATE_TARGET_ALPHABET)


# --------------------------------------------------------------------------
# Task 1: reversal
# --------------------------------------------------------------------------


def make_reversal_pairs(
    n: int,
    min_len: int = 3,
    max_len: int = 20,
    n_symbols: int = 10,
    seed: int = 0,
    lengths: Sequence[int] | None = None,
) -> list[Pair]:
    """Random strings and their reversals.

    Args:
        n: Number of pairs (ignored when ``lengths`` is given).
        min_len: Shortest source length (inclusive).
        max_len: Longest source length (inclusive). Lengths are uniform in
            ``[min_len, max_len]``.
        n_symbols: Alphabet size (the first ``n_symbols`` lowercase letters).
        seed: Seed of the ``numpy.random.Generator``; same seed, same pairs.
        lengths: Optional explicit source length of every pair (e.g. to build
            a test set with exactly ``k`` examples per length).

    Returns:
        ``n`` pairs ``(s, s[::-1])``.
    """
    rng = np.random.default_rng(seed)
    if lengths is None:
        lengths = rng.integers(min_len, max_len + 1, size=n)  # (N,)
    lengths = np.asarray(lengths, dtype=np.int64)
    alphabet = np.array(list(REVERSAL_ALPHABET[:n_symbols]))
    symbols = rng.integers(0, n_symbols, size=(len(lengths), int(lengths.max())))  # (N, max_len)
    pairs = []
    for row, length in zip(symbols, lengths):
        src = "".join(alphabet[row[:length]])
        pairs.append((src, src[::-1]))
    return pairs


def make_reversal_test_pairs(
    per_length: int,
    min_len: int = 3,
    max_len: int = 20,
    n_symbols: int = 10,
    seed: int = 10_000,
) -> list[Pair]:
    """A test set with exactly ``per_length`` pairs of each length in ``[min_len, max_len]``."""
    lengths = np.repeat(np.arange(min_len, max_len + 1), per_length)
    return make_reversal_pairs(len(lengths), n_symbols=n_symbols, seed=seed, lengths=lengths)


# --------------------------------------------------------------------------
# Task 2: dates
# --------------------------------------------------------------------------


def _date_formats(d: _dt.date) -> list[str]:
    """All human-readable renderings of ``d`` used by the dates task."""
    month = MONTHS[d.month - 1]
    weekday = WEEKDAYS[d.weekday()]
    return [
        f"{d.day} {month[:3]} {d.year}",  # 21 nov 2026
        f"{month} {d.day}, {d.year}",  # november 21, 2026
        f"{d.day:02d}/{d.month:02d}/{d.year}",  # 21/11/2026 (day first)
        f"{weekday[:3].title()} {d.day} {month.title()} {d.year}",  # Sat 21 November 2026
        f"{d.day} {month} {d.year}",  # 21 november 2026
        f"{month[:3].title()} {d.day} {d.year}",  # Nov 21 2026
        f"{weekday}, {month} {d.day}, {d.year}",  # saturday, november 21, 2026
        f"{d.day}.{d.month}.{d.year}",  # 21.11.2026
    ]


DATE_FORMAT_EXAMPLES = tuple(_date_formats(_dt.date(2026, 11, 21)))
"""One example of every source format, for display."""


def make_date_pairs(
    n: int,
    seed: int = 0,
    start: _dt.date = _dt.date(1950, 1, 1),
    end: _dt.date = _dt.date(2049, 12, 31),
) -> list[Pair]:
    """Human-readable dates and their ISO ``YYYY-MM-DD`` form.

    The date is uniform over ``[start, end]`` and the format uniform over the
    formats in :data:`DATE_FORMAT_EXAMPLES`.

    Args:
        n: Number of pairs.
        seed: Seed of the ``numpy.random.Generator``.
        start: Earliest date (inclusive).
        end: Latest date (inclusive).

    Returns:
        ``n`` pairs such as ``("Sat 21 November 2026", "2026-11-21")``.
    """
    rng = np.random.default_rng(seed)
    n_formats = len(DATE_FORMAT_EXAMPLES)
    days = rng.integers(start.toordinal(), end.toordinal() + 1, size=n)  # (N,)
    formats = rng.integers(0, n_formats, size=n)  # (N,)
    pairs = []
    for day, fmt in zip(days.tolist(), formats.tolist()):
        d = _dt.date.fromordinal(day)
        pairs.append((_date_formats(d)[fmt], d.isoformat()))
    return pairs


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def save_pairs(pairs: Iterable[Pair], path: str | Path) -> None:
    """Write pairs to a UTF-8 TSV file with a ``source<TAB>target`` header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE)
        writer.writerow(("source", "target"))
        for src, tgt in pairs:
            if any(c in s for s in (src, tgt) for c in "\t\n"):
                raise ValueError(f"tab or newline in pair {(src, tgt)!r}")
            writer.writerow((src, tgt))


def load_pairs(path: str | Path) -> list[Pair]:
    """Read pairs written by :func:`save_pairs`."""
    with Path(path).open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        if header != ["source", "target"]:
            raise ValueError(f"unexpected header {header}")
        return [(src, tgt) for src, tgt in reader]


# --------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Padded token ids of a batch of pairs (padding id 0, right-padded).

    Attributes:
        src: Source ids, ``(B, S)``, ``S = max(src_lengths)``.
        src_lengths: Number of real source tokens per row, ``(B,)``.
        tgt_in: Decoder inputs ``<sos> y_1 ... y_n``, ``(B, T)``.
        tgt_out: Decoder targets ``y_1 ... y_n <eos>``, ``(B, T)``.
        tgt_lengths: ``n + 1`` per row (real tokens of ``tgt_in``/``tgt_out``), ``(B,)``.
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor

    def __len__(self) -> int:
        return self.src.shape[0]

    def select(self, idx: torch.Tensor | slice) -> Batch:
        """Rows ``idx`` as a new batch, trimmed to its own longest sequences."""
        src_lengths, tgt_lengths = self.src_lengths[idx], self.tgt_lengths[idx]
        s, t = int(src_lengths.max()), int(tgt_lengths.max())
        return Batch(
            src=self.src[idx, :s],  # (B', S')
            src_lengths=src_lengths,
            tgt_in=self.tgt_in[idx, :t],  # (B', T')
            tgt_out=self.tgt_out[idx, :t],  # (B', T')
            tgt_lengths=tgt_lengths,
        )


def _pad(seqs: Sequence[list[int]], pad_id: int = 0) -> torch.Tensor:
    """Right-pad lists of ids into a ``(len(seqs), max_len)`` LongTensor."""
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)  # (N,)
    out = np.full((len(seqs), int(lengths.max())), pad_id, dtype=np.int64)  # (N, max_len)
    real = np.arange(out.shape[1]) < lengths[:, None]  # (N, max_len) True on real tokens
    out[real] = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64)  # row-major fill
    return torch.from_numpy(out)


def make_batch(pairs: Sequence[Pair], src_vocab: Vocab, tgt_vocab: Vocab) -> Batch:
    """Encode and pad pairs.

    Args:
        pairs: ``B`` ``(source, target)`` string pairs.
        src_vocab: Vocabulary of the sources.
        tgt_vocab: Vocabulary of the targets.

    Returns:
        A :class:`Batch` with ``src`` of shape ``(B, S)`` and ``tgt_in`` /
        ``tgt_out`` of shape ``(B, T)``, where ``S`` is the longest source
        and ``T`` the longest target plus one.
    """
    if not pairs:
        raise ValueError("no pairs")
    src = [src_vocab.encode(s) for s, _ in pairs]
    tgt = [tgt_vocab.encode(t) for _, t in pairs]
    return Batch(
        src=_pad(src),  # (B, S)
        src_lengths=torch.tensor([len(s) for s in src]),  # (B,)
        tgt_in=_pad([[tgt_vocab.sos_id, *t] for t in tgt]),  # (B, T)
        tgt_out=_pad([[*t, tgt_vocab.eos_id] for t in tgt]),  # (B, T)
        tgt_lengths=torch.tensor([len(t) + 1 for t in tgt]),  # (B,)
    )


def iter_batches(data: Batch, batch_size: int) -> Iterator[Batch]:
    """Consecutive (unshuffled) slices of ``data``, each trimmed to its own lengths."""
    for start in range(0, len(data), batch_size):
        yield data.select(slice(start, start + batch_size))
