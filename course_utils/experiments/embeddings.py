"""Word vectors for the self-attention notebook (notebook 03), trained offline with gensim.

The corpus ships inside gensim's wheel (``gensim/test/test_data``), so nothing is
downloaded. ``workers=1`` and a fixed seed make the vectors identical run after
run (the order of updates does not depend on thread scheduling).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

import torch

from course_utils.blocks import masks
from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.core.errors import InputError
from course_utils.experiments.loop import record_training

# gensim is imported where it is used: it takes a second or more to import (it loads scipy.stats), and the
# checkers, which every notebook and every graded kernel imports, import this module.
if TYPE_CHECKING:
    from gensim.models import KeyedVectors

# About 58,000 words of Australian news (ABC, 2001), 300 documents, one per line.
LEE_CORPUS = "lee_background.cor"


@dataclass(frozen=True)
class Word2VecConfig:
    """Settings of the Word2Vec (CBOW) model of notebook 03, Mikolov et al. 2013."""

    vector_size: int = 32  # D: features per word
    window: int = 5  # context words on each side
    min_count: int = 3  # rarer words are dropped from the vocabulary
    epochs: int = 20  # passes over the corpus
    seed: int = 0  # initial vectors and sampling; with workers=1 the result is reproducible


def load_corpus(name: str = LEE_CORPUS) -> list[list[str]]:
    """Read a corpus shipped with gensim as lists of lower-case tokens, one list per line.

    Args:
        name: A file in gensim's test data, e.g. ``"lee_background.cor"``.

    Returns:
        One list of tokens per document.

    Raises:
        InputError: If gensim does not ship a file of that name.
    """
    from gensim.test.utils import datapath
    from gensim.utils import simple_preprocess

    path = Path(datapath(name))
    if not path.is_file():
        shipped = sorted(p.name for p in path.parent.glob("*.cor"))
        raise InputError(f"gensim ships no corpus called {name!r}; available offline: {', '.join(shipped)}")
    with path.open(encoding="utf-8") as handle:
        return [simple_preprocess(line) for line in handle if line.strip()]


def train_word2vec(sentences: Sequence[Sequence[str]], config: Word2VecConfig = Word2VecConfig()) -> KeyedVectors:
    """Train Word2Vec with one worker (reproducible) and return its word vectors.

    Args:
        sentences: Tokenised documents, e.g. from ``load_corpus()``.
        config: Model settings.

    Returns:
        The trained ``KeyedVectors`` (vectors of shape (V, D), float32).
    """
    from gensim.models import Word2Vec

    start = time.perf_counter()
    model = Word2Vec(sentences, vector_size=config.vector_size, window=config.window, min_count=config.min_count,
                     epochs=config.epochs, seed=config.seed, workers=1)
    record_training(f"Word2Vec, D = {config.vector_size}, {config.epochs} epochs", time.perf_counter() - start)
    return model.wv


def sentence_matrix(vectors: KeyedVectors, sentence: str | Sequence[str]) -> torch.Tensor:
    """Stack the vectors of a sentence's words into X, one row per token.

    Args:
        vectors: Word vectors.
        sentence: A string (split on spaces) or a list of words.

    Returns:
        (T, D) float32 tensor.

    Raises:
        InputError: If a word is not in the vocabulary (the message lists which).
    """
    words = sentence.split() if isinstance(sentence, str) else list(sentence)
    if not words:
        raise InputError("the sentence is empty: give at least one word")
    missing = [w for w in words if w not in vectors.key_to_index]
    if missing:
        raise InputError(f"not in the vocabulary of {len(vectors)} words: {missing}. Words are lower case; rare "
                         "words (fewer than min_count occurrences) were dropped: pick words from the corpus")
    return torch.from_numpy(vectors[words].copy())  # (T, D)


def top_keys(x: torch.Tensor, lengths: torch.Tensor, W_q: torch.Tensor | None = None,
             W_k: torch.Tensor | None = None) -> torch.Tensor:
    """The key each query of a padded batch weighs most in self-attention (notebook 03, exercise 2).

    Args:
        x: (B, T, D) float tensor: sentence b's tokens at positions 0 .. lengths[b] - 1, padding after them.
        lengths: (B,) int64 tensor, the number of real tokens of each sentence (0 to T).
        W_q: (D, Dk) float query projection, or None (then W_k is None too) for q = k = x.
        W_k: (D, Dk) float key projection, or None.

    Returns:
        (B, T) int64 tensor: for each real query, the index of the real key with the largest
        weight; -1 for a padded query.
    """
    B, T, D = x.shape
    q = x if W_q is None else x @ W_q  # (B, T, D) @ (D, Dk) -> (B, T, Dk)
    k = x if W_k is None else x @ W_k  # (B, T, D) @ (D, Dk) -> (B, T, Dk)
    mask = masks.padding_mask(lengths, T)  # (B, 1, T): True at the real keys
    _, weights = scaled_dot_product_attention(q, k, x, mask)  # (B, T, T)
    top = weights.argmax(dim=-1)  # (B, T, T) -> (B, T): the key of largest weight
    real = torch.arange(T) < lengths[:, None]  # (T,) < (B, 1) -> (B, T): True at the real queries
    return top.masked_fill(~real, -1)
