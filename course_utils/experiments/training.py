"""The seq2seq experiment of notebooks 01, 02 and 07.

Training (:func:`train_step`, the step notebook 01 shows, run by :func:`train`, or a step with a loss
of the notebook's own, :func:`loss_step`), exact-match
evaluation, and the one-call length experiment.

Typical use in a notebook::

    config = Seq2SeqConfig()                       # reversal, lengths 3..20
    plain = run_length_experiment(config, decoder="plain")
    attn = run_length_experiment(config, decoder="attention")
    plain.accuracy[20], attn.accuracy[20]

On one machine, everything is deterministic given ``config.seed`` and
``config.num_threads`` (the CPU kernels' summation order depends on the thread
count). Another CPU, or MKL on another code path, can change the last bits,
and training grows them into different accuracies (see
``course_utils/core/portable.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from course_utils.blocks.seq2seq import DecoderKind, Seq2Seq, Seq2SeqConfig, build_seq2seq, sequence_loss
from course_utils.experiments.data import (
    DATA_DIR,
    Batch,
    Pair,
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
from course_utils.experiments.loop import TrainResult, num_threads, record_training, training_steps


def learning_rate(step: int, config: Seq2SeqConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine decay or constant."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_decay == "constant":
        return config.lr
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    floor = config.min_lr_frac
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _epoch_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless index batches: reshuffle every epoch, drop the incomplete last batch."""
    if n < batch_size:
        raise ValueError(f"need at least batch_size={batch_size} training pairs, got {n}")
    while True:
        perm = torch.randperm(n, generator=generator)  # (N,)
        for start in range(0, n - batch_size + 1, batch_size):
            yield perm[start : start + batch_size]  # (B,)


def teacher_forced_loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Cross-entropy of each target token given the source and the tokens before it (teacher forcing; notebook 07).

    The decoder reads ``batch.tgt_in``, the target shifted right by one
    (``<sos> y_0 ... y_{T-2}``), and is scored on ``batch.tgt_out``, the target
    itself (``y_0 ... y_{T-1}``, ending in ``<eos>``): position i sees tokens
    before i only and must predict token i.

    Args:
        model: Any model of the course's seq2seq interface, ``model(src, src_lengths, tgt_in) -> (B, T, V)``.
        batch: A :class:`~course_utils.experiments.data.Batch`.

    Returns:
        The mean loss over the real (non-pad) target tokens, a scalar.
    """
    logits = model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, T, V): position i has read <sos> y_0 ... y_{i-1}
    return sequence_loss(logits, batch.tgt_out)  # scored on y_i at position i (B*T tokens, padding ignored)


def train_step(model: torch.nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, lr: float,
               grad_clip: float, pad_id: int = 0) -> float:
    """One training step: the teacher-forced loss with padding ignored, backward, clipping, update (notebook 01).

    Args:
        model: Any model of the course's seq2seq interface, ``model(src, src_lengths, tgt_in) -> (B, T, V)``.
        batch: The step's pairs, a :class:`~course_utils.experiments.data.Batch`.
        optimizer: Over ``model``'s parameters.
        lr: This step's learning rate (see :func:`learning_rate`).
        grad_clip: Largest global gradient norm; 0 = no clipping.
        pad_id: Id of ``<pad>`` in the targets: those positions count for nothing.

    Returns:
        The step's loss (before the update), a float.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr  # this step's learning rate: warm-up, then decay
    logits = model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, T, V): fed <sos> y_0 ... y_{T-2}
    loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=pad_id)  # mean over real tokens
    optimizer.zero_grad(set_to_none=True)  # forget the previous step's gradients
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # shrink a gradient longer than grad_clip
    optimizer.step()
    return loss.item()


def loss_step(loss: Callable[[torch.nn.Module, Batch], torch.Tensor]) -> Callable[..., float]:
    """:func:`train_step` with another loss: the step minimises ``loss(model, batch)`` (notebook 07).

    Args:
        loss: A function ``(model, batch) -> scalar tensor``, such as :func:`teacher_forced_loss`.

    Returns:
        A step with :func:`train_step`'s arguments (``model, batch, optimizer, lr, grad_clip``) that sets the
        learning rate, computes ``loss``, goes backward, clips and updates, and returns the loss as a float.
    """

    def step(model: torch.nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, lr: float,
             grad_clip: float) -> float:
        for group in optimizer.param_groups:
            group["lr"] = lr  # this step's learning rate: warm-up, then decay
        value = loss(model, batch)  # a scalar tensor
        optimizer.zero_grad(set_to_none=True)  # forget the previous step's gradients
        value.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # shrink a gradient longer than grad_clip
        optimizer.step()
        return value.item()

    return step


def train(model: Seq2Seq, data: Batch, config: Seq2SeqConfig, progress: bool = False,
          step: Callable[..., float] | None = None,
          loss: Callable[[torch.nn.Module, Batch], torch.Tensor] | None = None) -> TrainResult:
    """Train with Adam, teacher forcing and gradient clipping: :func:`train_step` ``config.steps`` times.

    Batches are drawn from ``data`` without replacement (reshuffled each
    epoch) with a ``torch.Generator`` seeded by ``config.seed``, and trimmed
    to their own longest sequence.

    Args:
        model: The model to train (in place); left in eval mode.
        data: All training pairs, encoded with :func:`~course_utils.experiments.data.make_batch`.
        config: ``steps``, ``batch_size``, ``lr``, ``warmup_steps``,
            ``lr_decay``, ``min_lr_frac``, ``grad_clip``, ``seed``,
            ``num_threads`` and ``log_every`` are used.
        progress: If True, print ``step <k>  loss <x.xxx>`` every
            ``config.log_every`` steps (deterministic text: no times or rates).
        step: The step to run, with :func:`train_step`'s arguments (default
            :func:`train_step`; notebook 01 passes the copy it shows).
        loss: The loss every step minimises, a function ``(model, batch) -> scalar tensor`` (notebook 07 passes
            its ``teacher_forced_loss``): the step is then :func:`loss_step` of it. Default: :func:`train_step`'s
            own cross-entropy.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ValueError: If both ``step`` and ``loss`` are given.
    """
    if step is not None and loss is not None:
        raise ValueError("give train either a step or a loss, not both: a step computes its own loss")
    step = loss_step(loss) if loss is not None else train_step if step is None else step
    generator = torch.Generator().manual_seed(config.seed)
    batches = _epoch_batches(len(data), config.batch_size, generator)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    steps = training_steps(config)
    log_every = config.log_every if progress else 0
    losses: list[float] = []
    model.train()
    with num_threads(config.num_threads):
        start = time.perf_counter()
        for k in range(steps):
            losses.append(step(model, data.select(next(batches)), optimizer, learning_rate(k, config), config.grad_clip))
            if log_every > 0 and ((k + 1) % log_every == 0 or k + 1 == steps):
                recent = losses[-log_every:]
                print(f"step {k + 1:5d}  loss {sum(recent) / len(recent):.3f}")
        seconds = time.perf_counter() - start
    model.eval()
    record_training(f"{type(model).__name__}, {config.task}, {steps} steps", seconds)
    return TrainResult(losses=tuple(losses), seconds=seconds, steps=steps)


def sequence_exact_match(tokens: torch.Tensor, targets: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Whether each predicted sequence equals its target on every real target position (notebook 01, exercise 2).

    Positions where the target is padding are ignored (a model may write
    anything after its ``<eos>``); since the targets end in ``<eos>``, the
    prediction must stop at exactly the right place.

    Args:
        tokens: ``(B, T)`` int64 predicted ids.
        targets: ``(B, T)`` int64 target ids, ``pad_id`` after each sequence.
        pad_id: Id of ``<pad>``.

    Returns:
        ``(B,)`` bool, True where the whole sequence is right.
    """
    real = targets != pad_id  # (B, T): positions that must match
    return ((tokens == targets) | ~real).all(dim=1)  # (B, T) -> (B,)


@torch.no_grad()
def exact_match(model: Seq2Seq, data: Batch, batch_size: int = 512) -> torch.Tensor:
    """Whether greedy decoding reproduces each target exactly (including ``<eos>`` at the right place).

    Args:
        model: A trained model.
        data: Encoded pairs, one row per pair.
        batch_size: Rows decoded at once.

    Returns:
        Bool tensor with one entry per row of ``data``.
    """
    model.eval()
    correct = []
    for batch in iter_batches(data, batch_size):
        t = batch.tgt_out.shape[1]
        tokens, _ = model.greedy_decode(batch.src, batch.src_lengths, max_len=t)  # (B, T') with T' <= T
        tokens = torch.nn.functional.pad(tokens, (0, t - tokens.shape[1]))  # (B, T') -> (B, T), pad id 0
        correct.append(sequence_exact_match(tokens, batch.tgt_out))  # (B,)
    return torch.cat(correct)


def accuracy_by_length(
    model: Seq2Seq, data: Batch | Sequence[Pair], src_vocab: Vocab | None = None, tgt_vocab: Vocab | None = None
) -> dict[int, float]:
    """Exact-match accuracy grouped by source length.

    Args:
        model: A trained model.
        data: Encoded pairs, or string pairs together with ``src_vocab`` and ``tgt_vocab``.
        src_vocab: Needed only if ``data`` are string pairs.
        tgt_vocab: Needed only if ``data`` are string pairs.

    Returns:
        ``{source_length: fraction of pairs of that length decoded exactly}``, sorted by length.
    """
    if not isinstance(data, Batch):
        if src_vocab is None or tgt_vocab is None:
            raise ValueError("string pairs need src_vocab and tgt_vocab")
        data = make_batch(data, src_vocab, tgt_vocab)
    correct = exact_match(model, data).float()  # (N,)
    return {
        int(length): correct[data.src_lengths == length].mean().item()
        for length in torch.unique(data.src_lengths).tolist()
    }


@dataclass(frozen=True)
class ExperimentResult:
    """Output of :func:`run_length_experiment`.

    Attributes:
        decoder: ``"plain"`` or ``"attention"``.
        accuracy: ``{source_length: exact-match fraction}`` on the test set.
        overall: Exact-match fraction over the whole test set.
        train: The :class:`TrainResult` (losses, seconds, steps).
        model: The trained model (e.g. for attention heatmaps).
        src_vocab: Source vocabulary.
        tgt_vocab: Target vocabulary.
        test_pairs: The test pairs the accuracies were measured on.
    """

    decoder: str
    accuracy: dict[int, float]
    overall: float
    train: TrainResult
    model: Seq2Seq
    src_vocab: Vocab
    tgt_vocab: Vocab
    test_pairs: tuple[Pair, ...]


def make_task(config: Seq2SeqConfig) -> tuple[list[Pair], list[Pair], Vocab, Vocab]:
    """Training pairs, test pairs and vocabularies for ``config.task``.

    Reversal: ``config.n_train`` pairs with lengths uniform in
    ``[min_len, max_len]``, and ``n_test_per_length`` test pairs for every
    length. Dates: ``n_train`` pairs and ``10 * n_test_per_length`` test pairs.
    Training data depend on ``config.seed``; the test set is the same for all
    seeds (seed 10_000 + a task offset) and never overlaps the training seed.
    """
    if config.task == "reversal":
        vocab = reversal_vocab(config.n_symbols)
        train_pairs = make_reversal_pairs(
            config.n_train, config.min_len, config.max_len, config.n_symbols, seed=config.seed
        )
        test_pairs = make_reversal_test_pairs(
            config.n_test_per_length, config.min_len, config.max_len, config.n_symbols, seed=10_000
        )
        return train_pairs, test_pairs, vocab, vocab
    if config.task == "dates":
        src_vocab, tgt_vocab = date_vocabs()
        train_pairs = make_date_pairs(config.n_train, seed=config.seed)
        test_pairs = make_date_pairs(10 * config.n_test_per_length, seed=10_001)
        return train_pairs, test_pairs, src_vocab, tgt_vocab
    raise ValueError(f"unknown task {config.task!r}")


TASKS = ("reversal", "dates")


def write_splits(folder: Path = DATA_DIR) -> list[Path]:
    """Write the committed splits ``<task>_train.tsv`` and ``<task>_test.tsv``.

    They are exactly what :func:`make_task` generates for the default
    :class:`Seq2SeqConfig` of each task (``make data`` calls this; a test
    checks the committed files against a fresh generation).
    """
    written = []
    for task in TASKS:
        train_pairs, test_pairs, _, _ = make_task(Seq2SeqConfig(task=task))
        for split, pairs in (("train", train_pairs), ("test", test_pairs)):
            path = Path(folder) / f"{task}_{split}.tsv"
            save_pairs(pairs, path)
            written.append(path)
    return written


def load_splits(task: str, folder: Path = DATA_DIR) -> tuple[list[Pair], list[Pair]]:
    """The committed ``(train_pairs, test_pairs)`` of a task, from ``data/``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return load_pairs(Path(folder) / f"{task}_train.tsv"), load_pairs(Path(folder) / f"{task}_test.tsv")


def run_length_experiment(
    config: Seq2SeqConfig,
    decoder: DecoderKind = "attention",
    progress: bool = False,
    train_pairs: Sequence[Pair] | None = None,
    test_pairs: Sequence[Pair] | None = None,
    additive_attention: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> ExperimentResult:
    """Generate data, build, train and evaluate one model, in one call.

    Args:
        config: Task, sizes, training budget and seed. Use the *same* config
            for ``"plain"`` and ``"attention"`` to compare them fairly.
        decoder: ``"plain"`` (context-vector bottleneck) or ``"attention"`` (Bahdanau).
        progress: Print the rounded loss every ``config.log_every`` steps.
        train_pairs: Optional training pairs (e.g. loaded from ``data/``);
            default: generated by :func:`make_task` from ``config``.
        test_pairs: Optional test set; default: generated by :func:`make_task`.
        additive_attention: Optional function the model's additive scorer uses for the scores, the
            weights and the context of each step (notebook 02 passes the learner's own);
            default: :func:`course_utils.blocks.scorers.additive_attention`.

    Returns:
        An :class:`ExperimentResult` with accuracy by source length and training time.

    Raises:
        ValueError: If ``additive_attention`` is given for a model without an additive scorer.
    """
    if additive_attention is not None and (decoder != "attention" or config.score != "additive"):
        raise ValueError("additive_attention is used only by an attention decoder with the additive score, got "
                         f"decoder={decoder!r} and score={config.score!r}")
    default_train, default_test, src_vocab, tgt_vocab = make_task(config)
    train_pairs = default_train if train_pairs is None else list(train_pairs)
    test_pairs = tuple(default_test if test_pairs is None else test_pairs)
    train_data = make_batch(train_pairs, src_vocab, tgt_vocab)
    test_data = make_batch(test_pairs, src_vocab, tgt_vocab)
    torch.manual_seed(config.seed)
    model = build_seq2seq(config, len(src_vocab), len(tgt_vocab), decoder)
    if additive_attention is not None:
        model.decoder.scorer.attention = additive_attention  # the same weights; the step runs the given function
    result = train(model, train_data, config, progress=progress)
    with num_threads(config.num_threads):
        correct = exact_match(model, test_data).float()  # (N,)
    accuracy = {
        int(length): correct[test_data.src_lengths == length].mean().item()
        for length in torch.unique(test_data.src_lengths).tolist()
    }
    return ExperimentResult(
        decoder=decoder,
        accuracy=accuracy,
        overall=correct.mean().item(),
        train=result,
        model=model,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        test_pairs=test_pairs,
    )
