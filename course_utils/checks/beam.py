"""Checker for notebook 01, exercise 3: beam search.

The designed and random decoders it runs a learner's search on, the checker's own
search (written apart from the reference, with each usual mistake it can name), and
the checks of the tokens and scores returned. The messages name the likely bug in
words; they never print the expected tokens or scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from course_utils.blocks import decoding, seq2seq
from course_utils.checks.core import call, check_tensor, describe, passed, reference_guard, sweep
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


# --- exercise 3: beam search ---------------------------------------------------------------------------------

_A, _B, _C, _D, _E = 3, 4, 5, 6, 7  # the symbols of the designed models below (0 <pad>, 1 <sos>, 2 <eos>)
_EOS = 2
_TWINS = {_B: _A}  # in the tie cases, token b is interchangeable with token a


def _random_model(seed: int, V: int) -> seq2seq.Seq2Seq:
    """A small plain encoder-decoder with random weights (drawn from ``seed`` alone); never writes <pad> or <sos>."""
    with torch.random.fork_rng(devices=[]):  # the layers' own initialisation draws; the learner's state stays
        encoder = seq2seq.Encoder(V, 6, 5)
        model = seq2seq.Seq2Seq(encoder, seq2seq.PlainDecoder(V, 6, 5, encoder.out_size))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.2 if name.startswith("decoder.out") else 0.8))
        model.decoder.out.bias[:2] = -30.0  # so a 0 in an answer is padding
        model.decoder.out.bias[_EOS] -= 1.0  # hypotheses of several lengths, some cut at max_len
    return model.eval()


def _state_model(seed: int, V: int = 9) -> seq2seq.Seq2Seq:
    """A small random encoder-decoder whose logits read the decoder's state alone (not ``c``, not the last token).

    The state carries the whole prefix, so an extension that continues from another
    prefix's state than its parent's gets other log-probabilities (the designed Markov
    decoders below keep their state fixed, so they cannot show that).
    """
    model = _random_model(seed, V)
    with torch.no_grad():
        model.decoder.out.weight[:, model.decoder.gru.hidden_size:] = 0.0  # logits_i = W_out s_i + b
    return model


# (model seed, k) of the decoders above: each one catches that mistake (a score, and in 8 of them a token, changes)
_STATE_CASES = [(seed, k) for seed in (1, 2, 3) for k in (2, 3, 4)]


def _markov_model(table: Mapping[int, Mapping[int, float]], V: int = 8) -> seq2seq.Seq2Seq:
    """A plain encoder-decoder whose decoder is a first-order Markov chain: ``p(y_i | y_{i-1}) = table[y_{i-1}][y_i]``.

    The decoder's GRU keeps its state (its update gate is shut), its embedding is
    one-hot and its output layer reads only the embedding, so its logits are the
    table's log-probabilities. Tokens a row of ``table`` leaves out share what is
    left of its probability (rows not given: uniform); ``<pad>`` and ``<sos>`` get none.
    """
    with torch.random.fork_rng(devices=[]):
        encoder, decoder = seq2seq.Encoder(V, 4, 2), seq2seq.PlainDecoder(V, V, 2, 4)
    logp = torch.full((V, V), -30.0)  # (y_{i-1}, y_i)
    for prev in range(V):
        given = table.get(prev, {})
        rest = [y for y in range(_EOS, V) if y not in given]
        for y in range(_EOS, V):
            logp[prev, y] = math.log(given[y] if y in given else (1.0 - sum(given.values())) / len(rest))
    with torch.no_grad():
        for p in [*encoder.parameters(), *decoder.parameters()]:
            p.zero_()
        decoder.embedding.weight.copy_(torch.eye(V))
        decoder.gru.bias_hh_l0[2:4] = 30.0  # update gate z = 1: s_i = s_{i-1}
        decoder.out.weight[:, -V:] = logp.T  # logits of y_i = log p(y_i | y_{i-1})
    return seq2seq.Seq2Seq(encoder, decoder).eval()


_DESIGNED = [  # (what the model does, its table {y_{i-1}: {y_i: p}}, k, max_len); each usual mistake fails one
    ("a model whose most likely first token leads only to unlikely continuations (beam_size = 2)",
     {1: {_A: 0.55, _B: 0.44}, _A: {_C: 0.3, _D: 0.26, _E: 0.24, _EOS: 0.15}, _B: {_EOS: 0.95}}, 2, 4),
    ("a model where an unlikely prefix has a very likely next token (beam_size = 2)",
     {1: {_A: 0.8, _B: 0.15}, _A: {_C: 0.5, _D: 0.45}, _B: {_E: 0.99}, _C: {_EOS: 0.3}, _D: {_EOS: 0.95},
      _E: {_EOS: 0.95}}, 2, 4),
    ("a model whose best hypothesis finishes after a worse one (beam_size = 2)",
     {1: {_A: 0.6, _EOS: 0.35}, _A: {_EOS: 0.9}}, 2, 3),
    ("a model where a beam that narrows as hypotheses finish and a beam refilled to beam_size disagree "
     "(beam_size = 2)",
     {1: {_A: 0.9, _EOS: 0.05}, _A: {_B: 0.5, _C: 0.45}, _B: {_A: 0.26, _C: 0.24, _D: 0.21, _E: 0.19, _EOS: 0.08},
      _C: {_EOS: 0.99}}, 2, 3),
    ("a model where a prefix cut at max_len is more likely than every finished hypothesis (beam_size = 2)",
     {1: {_A: 0.7, _EOS: 0.2}, _A: {_B: 0.8, _EOS: 0.1}}, 2, 2),
    ("a model whose most likely first token is <eos> (beam_size = 3)",
     {1: {_EOS: 0.5, _A: 0.45}, _A: {_B: 0.95}, _B: {_C: 0.95}, _C: {_EOS: 0.95}}, 3, 5),
    ("a model whose most likely first token is <eos> (beam_size = 1)", {1: {_EOS: 0.5, _A: 0.45}}, 1, 5),
    ("a model with two interchangeable tokens, tied (beam_size = 2)",
     {1: {_C: 0.4, _A: 0.28, _B: 0.28}, _A: {_EOS: 0.9}, _B: {_EOS: 0.9}, _C: {_EOS: 0.5}}, 2, 4),
    ("a model with two interchangeable tokens, tied (beam_size = 1)",
     {1: {_A: 0.4, _B: 0.4, _C: 0.15}, _A: {_D: 0.7}, _B: {_D: 0.7}, _D: {_EOS: 0.8}}, 1, 4),
]

_MISTAKES = {
    "no sum": "the extensions were ranked by the new token's log-probability alone; a prefix's score is the sum "
              "over all its tokens, so add the new token's log-probability to its prefix's score",
    "keeps k": "the beam kept beam_size prefixes after a hypothesis had finished, refilled as in Sutskever et al.'s "
               "decoder. That is a beam search too, but this exercise asks for the variant in which each finished "
               "hypothesis keeps one of the beam_size places, so the beam narrows by one (step 3)",
    "stops at first": "the search stopped when the first hypothesis wrote <eos>; it goes on until the beam is empty or "
                      "the prefixes have max_len tokens",
    "first finished": "the answer is the first hypothesis that finished, but it must be the one with the highest score",
    "finished only": "a prefix cut at max_len was left out of the final choice; it counts as a hypothesis with the "
                     "score it has",
    "length": "the hypotheses were ranked by their score divided by their length; here the score is the plain sum "
              "of log-probabilities",
}

_STATE_MISTAKE = ("each kept extension went on from the decoder state at its own place in the beam, but an extension "
                  "must continue from its parent's state, the new state of the prefix it extends (the prefixes "
                  "change places in the beam from one step to the next)")


@exercise_check
def check_beam_search(fn: Callable[..., Any], seed: int = 0, B: int = 4, S: int = 5, V: int = 7, k: int = 3,
                      max_len: int = 6) -> None:
    """Check a learner's ``beam_search(model, src, src_lengths, beam_size, max_len)`` (notebook 01, exercise 3).

    On small plain encoder-decoders with random weights: the tokens and scores at the
    sizes asked for, at B = 1, and at k = 1, which must be the notebook's greedy
    decoding. Then on decoders built to be first-order Markov chains, where each usual
    mistake changes the answer (:data:`_DESIGNED`): greedy's first choice leads
    nowhere, a prefix's score must add up its tokens, the best hypothesis finishes
    after a worse one, the beam narrows (this exercise's variant; Sutskever et al.'s
    beam is refilled, and is named as the other variant), a prefix cut at max_len
    beats the finished ones, ``<eos>`` is the best first token (k = 3 and k = 1), and exact ties between
    two interchangeable tokens (any tie-breaking is accepted). Then random decoders whose
    logits read only their state (:data:`_STATE_CASES`), where an extension that does
    not continue from its parent's state changes the answer. Last, k = 8 on a
    vocabulary of 5 tokens. Each score must be the sum of the log-probabilities of the
    tokens returned. Decoding is discrete (the tokens are chosen, not computed), so
    there is no gradient to check.

    Raises:
        CheckError: Naming the likely bug; never the expected tokens or scores.
    """
    __tracebackhide__ = True  # noqa: F841
    cases = [(f"(B, S, V, beam_size) = {(B, S, V, k)}", {"B": B, "k": k}, ""),
             ("B = 1", {"B": 1, "k": k}, "with a batch of one, look for a `.squeeze()` or an index [0] that drops "
                                         "the batch axis"),
             ("beam_size = 1", {"B": B, "k": 1},
              "with beam_size = 1, beam search must give greedy decoding's answer (section 3)")]

    def sources(B: int, S: int, V: int, seed: int = seed) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, S + 1, (B,), generator=g)
        lengths[0], lengths[-1] = S, (1 if B > 1 else S)  # a full-length source and a one-token one
        src = torch.randint(3, V, (B, S), generator=g).masked_fill(torch.arange(S)[None, :] >= lengths[:, None], 0)
        return src, lengths  # (B, S), (B,)

    with reference_guard(fn, decoding.beam_search):
        sweep(lambda B, k: _beam_case(fn, _random_model(seed, V), *sources(B, S, V), k, max_len, ""), cases)
        for label, table, k_probe, max_probe in _DESIGNED:
            _beam_case(fn, _markov_model(table), torch.tensor([[_A, _B, _C]]), torch.tensor([3]), k_probe, max_probe,
                       f"on {label}: ")
        for model_seed, k_probe in _STATE_CASES:
            _beam_case(fn, _state_model(model_seed), *sources(8, 5, 9, model_seed), k_probe, 8,
                       f"on a random decoder whose next token depends on its state alone (beam_size = {k_probe}): ")
        _beam_case(fn, _random_model(seed + 1, 5), *sources(2, S, 5), 8, max_len, "with beam_size = 8 > V = 5: ")
    passed("beam_search")


def _search(model: seq2seq.Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, k: int, max_len: int,
            change: str = "") -> list[tuple[int, ...]]:
    """Beam search as the exercise states it, written another way, or with one of :data:`_MISTAKES`."""
    return [tokens for tokens, _ in _search_scored(model, src, lengths, k, max_len, change)]


@torch.no_grad()
def _search_scored(model: seq2seq.Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, k: int, max_len: int,
                   change: str = "") -> list[tuple[tuple[int, ...], float]]:
    """:func:`_search`'s answers with their scores; ``change="slot state"``: :data:`_STATE_MISTAKE`."""
    _, contexts = model.encoder(src, lengths)
    answers = []
    for context in contexts.split(1):
        beam = [((), 0.0, model.decoder.initial_state(context))]  # (tokens, score, state (1, R))
        finished: list[tuple[tuple[int, ...], float, torch.Tensor]] = []
        for _ in range(max_len):
            y = torch.tensor([tokens[-1] if tokens else 1 for tokens, _, _ in beam])
            logits, states = model.decoder.step(y, torch.cat([s for *_, s in beam]), context.expand(len(beam), -1))
            logp = logits.log_softmax(dim=-1).tolist()
            candidates = sorted(((tokens + (w,), score + row[w], states[i:i + 1],  # ranked by the last item
                                  row[w] if change == "no sum" else score + row[w])
                                 for i, ((tokens, score, _), row) in enumerate(zip(beam, logp))
                                 for w in range(len(row))), key=lambda c: -c[3])
            beam = []
            for slot, c in enumerate(candidates[: k if change == "keeps k" else k - len(finished)]):
                if change == "slot state":  # the state at its own place in the beam, not at its parent's
                    c = (*c[:2], states[min(slot, len(states) - 1)][None])
                (finished if c[0][-1] == _EOS else beam).append(c[:3])
            if not beam or len(finished) >= k or (change == "stops at first" and finished):
                break
        pool = finished if change in ("finished only", "first finished") and finished else finished + beam
        pool = pool[:1] if change == "first finished" else pool
        answers.append(max(pool, key=lambda c: c[1] / len(c[0]) if change == "length" else c[1])[:2])
    return answers


def _follows_slots(model: seq2seq.Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, k: int, max_len: int,
                   mine: list[tuple[int, ...]], scores: torch.Tensor) -> bool:
    """Whether the answer is, tokens and scores, that of a search whose extensions keep the state of their slot."""
    slots = _search_scored(model, src, lengths, k, max_len, "slot state")
    return all(tokens == mine[b] and abs(score - scores[b].item()) <= 1e-4 * (1 + abs(score))
               for b, (tokens, score) in enumerate(slots))


def _rows(tokens: torch.Tensor) -> list[tuple[int, ...]]:
    """Each row's hypothesis: its tokens up to the first <eos> (kept), or up to the padding."""
    rows = [row[: row.index(_EOS) + 1] if _EOS in row else row for row in tokens.tolist()]
    return [tuple(t for t in row if t != 0) for row in rows]


def _beam_case(fn: Callable[..., Any], model: seq2seq.Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, k: int,
               max_len: int, where: str) -> None:
    """One call of the learner's beam search, compared with the reference's answer (or one as likely: a tie)."""
    __tracebackhide__ = True  # noqa: F841
    B = src.shape[0]
    saved = [t.clone() for t in (src, lengths, *model.state_dict().values())]
    with torch.no_grad():
        got = call(fn, model, src, lengths, k, max_len, name="beam_search", expected="a tuple (tokens, scores)",
                   error_hint="the first step has one prefix, so it has only V candidates (fewer than beam_size if "
                              "beam_size > V), and the beam holds fewer than beam_size prefixes once hypotheses "
                              "have finished")
    if not all(torch.equal(a, b) for a, b in zip(saved, (src, lengths, *model.state_dict().values()))):
        raise CheckError(f"{where}beam_search changed its inputs or the model's weights: read them, do not write")
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckError(f"{where}expected a tuple (tokens, scores), got {describe(got)}")
    want_tokens, want_scores = decoding.beam_search(model, src, lengths, k, max_len)
    want = _rows(want_tokens)
    mine = _check_rows(got[0], B, k, max_len, want, where)
    scores = check_tensor(got[1], name=f"{where}the scores", shape="B", dims={"B": B},
                          hints={(B, k): "one score per hypothesis in the beam: return only the best one's"})
    if not scores.is_floating_point():
        raise CheckError(f"{where}expected float scores (sums of log-probabilities), got dtype {scores.dtype}")
    try:
        _check_scores(model, src, lengths, mine, scores.float(), where)
    except CheckError:
        if _follows_slots(model, src, lengths, k, max_len, mine, scores.float()):
            raise CheckError(f"{where}the scores are not the sums of the log-probabilities of the tokens you "
                             f"returned: {_STATE_MISTAKE}") from None
        raise
    wrong = [b for b in range(B) if tuple(_TWINS.get(t, t) for t in mine[b]) != tuple(_TWINS.get(t, t) for t in want[b])
             and abs(scores[b].item() - want_scores[b].item()) > 1e-5]  # a hypothesis as likely is a tie
    if not wrong:
        return
    rows = f"rows {wrong} of {B}"
    if k == 1:
        raise CheckError(f"{where}with beam_size = 1, beam search is greedy decoding (section 3), but {rows} "
                         "differ from greedy decoding's answer: keep the single most likely extension at each step")
    greedy = _rows(seq2seq.plain_greedy_decode(model.encoder, model.decoder, src, lengths, max_len))
    if all(mine[b] == greedy[b] for b in wrong):
        raise CheckError(f"{where}{rows} are greedy decoding's answer; with beam_size = {k} the beam keeps the "
                         "beam_size best prefixes at every step, and one that is not the most likely at first can win")
    if _follows_slots(model, src, lengths, k, max_len, mine, scores.float()):
        raise CheckError(f"{where}{rows} are wrong: {_STATE_MISTAKE}")
    for change, mistake in _MISTAKES.items():
        variant = _search(model, src, lengths, k, max_len, change)
        if all(mine[b] == variant[b] for b in wrong) and variant != want:
            # a beam refilled to beam_size is the cited paper's own search: another variant, not a wrong one
            verdict = "differ from this exercise's answer" if change == "keeps k" else "are wrong"
            raise CheckError(f"{where}{rows} {verdict}: {mistake}")
    if any(_EOS not in mine[b] and len(mine[b]) < max_len for b in wrong):
        raise CheckError(f"{where}{rows} are wrong, and some end without <eos> before max_len = {max_len} tokens: "
                         "did the search stop while prefixes were still in the beam?")
    more = [b for b in wrong if scores[b] > want_scores[b]]
    raise CheckError(f"{where}{rows} are not the hypothesis that the beam search of the statement finds. " + (
        f"Yours is more likely in rows {more}: does the beam keep more prefixes than step 3 of this exercise "
        "allows, beam_size minus the hypotheses finished so far?"
        if more else "A more likely one is in reach of the beam: is a good prefix dropped, or a finished one lost?"))


def _check_rows(tokens: Any, B: int, k: int, max_len: int, want: list[tuple[int, ...]],
                where: str) -> list[tuple[int, ...]]:
    """The tokens' type, shape and layout: each row one hypothesis, <eos> kept, then only padding."""
    __tracebackhide__ = True  # noqa: F841
    if not isinstance(tokens, torch.Tensor):
        raise CheckError(f"{where}expected the tokens as a torch.Tensor of shape (B, T'), got {describe(tokens)}")
    if tokens.dim() == 3 and tokens.shape[:2] == (B, k):
        raise CheckError(f"{where}the tokens have shape {tuple(tokens.shape)}, one row per hypothesis in the beam: "
                         "return only the best hypothesis of each source, (B, T')")
    if tokens.dim() != 2 or tokens.shape[0] != B:
        raise CheckError(f"{where}expected the tokens of shape (B, T') with B = {B}, got {tuple(tokens.shape)}")
    if tokens.dtype != torch.long:
        raise CheckError(f"{where}expected the tokens as int64 ids, got dtype {tokens.dtype}")
    if tokens.shape[1] and (tokens[:, 0] == 1).all():
        raise CheckError(f"{where}every row starts with <sos> (id 1): it is the first input, not a written token")
    if tokens.shape[1] > max_len:
        raise CheckError(f"{where}the tokens have {tokens.shape[1]} columns, more than max_len = {max_len}: a "
                         "hypothesis has at most max_len tokens, <eos> included")
    for b, row in enumerate(tokens.tolist()):
        end = row.index(_EOS) + 1 if _EOS in row else len(row)
        if any(row[end:]):
            raise CheckError(f"{where}row {b} goes on after its <eos>: a hypothesis that writes <eos> is finished, "
                             "and the row is padded with 0 after it")
        if 0 in row[:end] and any(row[row.index(0):end]):
            raise CheckError(f"{where}row {b} has padding (0) inside its hypothesis: pad only at the end")
    mine = _rows(tokens)
    if any(not hypothesis for hypothesis in mine):
        raise CheckError(f"{where}a row of the tokens is empty: every answer has at least one token, if only <eos>")
    ended = [b for b in range(B) if want[b][-1:] == (_EOS,)]
    if ended and all(mine[b] + (_EOS,) == want[b] for b in ended):
        raise CheckError(f"{where}a finished hypothesis lost its <eos>: keep it, it is part of the answer")
    return mine


def _check_scores(model: seq2seq.Seq2Seq, src: torch.Tensor, lengths: torch.Tensor,
                  hypotheses: list[tuple[int, ...]], scores: torch.Tensor, where: str) -> None:
    """Each score must be the sum of log p(y_i | y_<i, x) over its row's tokens, <eos> included."""
    __tracebackhide__ = True  # noqa: F841
    T = max(len(h) for h in hypotheses)
    tgt_out = torch.tensor([list(h) + [0] * (T - len(h)) for h in hypotheses])  # (B, T)
    tgt_in = torch.cat([torch.ones(len(hypotheses), 1, dtype=torch.long), tgt_out[:, :-1]], dim=1)  # (B, T)
    real = tgt_out != 0  # (B, T)
    with torch.no_grad():
        logits = model(src, lengths, tgt_in)  # (B, T, V): teacher forcing on the learner's own tokens
    per_token = logits.log_softmax(-1).gather(-1, tgt_out[..., None])[..., 0] * real  # (B, T)
    want = per_token.sum(1)  # (B,)
    close = torch.isclose(scores, want, atol=1e-4, rtol=1e-4)
    if close.all():
        return
    counts = real.sum(1).clamp(min=1)  # (B,)
    suspects = {
        "probabilities, not log-probabilities: a score is a sum of log-probabilities (a product of probabilities "
        "underflows)": want.exp(),
        "sums of logits: turn the logits into log-probabilities first (log_softmax)":
            (logits.gather(-1, tgt_out[..., None])[..., 0] * real).sum(1),
        "the log-probability of the last token only: a score adds up every token's":
            per_token.gather(1, (counts - 1)[:, None])[:, 0],
        "divided by the length: here a score is the plain sum": want / counts,
        "without the <eos> token's log-probability: it counts like every other token":
            want - (per_token * (tgt_out == _EOS)).sum(1),
    }
    for mistake, value in suspects.items():
        if torch.allclose(scores, value, atol=1e-4, rtol=1e-4):
            raise CheckError(f"{where}the scores are {mistake}")
    wrong = (~close).nonzero().flatten().tolist()
    raise CheckError(f"{where}the scores of rows {wrong} are not the sums of the log-probabilities of the tokens you "
                     "returned (each log p(y_i | y_<i, x), <eos> included). If each step's log-probabilities came "
                     "from the wrong decoder state: does every kept extension carry the new state of the prefix it "
                     "extends (the state at its parent's row, not at its own place in the beam)?")
