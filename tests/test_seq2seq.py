"""Tests for course_utils.blocks.seq2seq (models, scorers, masking) and course_utils.experiments.training."""

import dataclasses

import pytest
import torch

from course_utils.blocks.attention import masked_softmax
from course_utils.experiments.data import make_batch, make_reversal_pairs, reversal_vocab
from course_utils.blocks.scorers import AdditiveScore, BilinearScore, ConcatScore, DotScore, attend
from course_utils.blocks.seq2seq import AttentionDecoder, Encoder, PlainDecoder, Seq2Seq, Seq2SeqConfig, build_seq2seq
from course_utils.experiments.training import accuracy_by_length, exact_match, learning_rate, run_length_experiment, train

SMALL = Seq2SeqConfig(embed_size=8, hidden_size=12, attn_size=10, steps=5, batch_size=4, n_symbols=6)


def lengths_mask(lengths, s):
    return torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)


def all_scorers(dq, dk, a=7):
    scorers = [AdditiveScore(dq, dk, a), ConcatScore(dq, dk, a), BilinearScore(dq, dk)]
    if dq == dk:
        scorers.append(DotScore())
    return scorers


@pytest.mark.parametrize("b,s,dq,dk", [(1, 1, 4, 4), (3, 5, 4, 6), (2, 9, 8, 8)])
def test_scorer_shapes(b, s, dq, dk):
    torch.manual_seed(0)
    query, keys = torch.randn(b, dq), torch.randn(b, s, dk)
    for scorer in all_scorers(dq, dk):
        scores = scorer(query, keys, torch.ones(b, s, dtype=torch.bool))
        assert scores.shape == (b, s), type(scorer).__name__
        # precompute + score (used by the decoder) gives the same as forward
        torch.testing.assert_close(scorer.score(query, scorer.precompute(keys)), scores)


def test_dot_score_value_and_width_check():
    query, keys = torch.tensor([[1.0, 2.0]]), torch.tensor([[[3.0, 4.0], [0.0, -1.0]]])
    assert DotScore()(query, keys).tolist() == [[11.0, -2.0]]
    with pytest.raises(ValueError):
        DotScore()(torch.randn(1, 3), torch.randn(1, 2, 4))


def test_concat_equals_additive_when_weight_is_split():
    torch.manual_seed(0)
    dq, dk, a = 5, 7, 6
    concat, additive = ConcatScore(dq, dk, a), AdditiveScore(dq, dk, a)
    with torch.no_grad():
        additive.W_q.weight.copy_(concat.W.weight[:, :dq])  # first block multiplies the query
        additive.W_k.weight.copy_(concat.W.weight[:, dq:])  # second block multiplies the key
        additive.W_k.bias.copy_(concat.W.bias)
        additive.v_a.copy_(concat.v_a)
    query, keys = torch.randn(3, dq), torch.randn(3, 4, dk)
    torch.testing.assert_close(concat(query, keys), additive(query, keys))
    with torch.no_grad():
        additive.v_a.add_(0.1)
    assert not torch.allclose(concat(query, keys), additive(query, keys))


def test_bilinear_matches_formula():
    torch.manual_seed(0)
    scorer = BilinearScore(3, 5)
    query, keys = torch.randn(2, 3), torch.randn(2, 4, 5)
    expected = torch.einsum("bq,qk,bsk->bs", query, scorer.W, keys)
    torch.testing.assert_close(scorer(query, keys), expected)


def test_attend_weights_sum_to_one_and_padding_gets_zero():
    torch.manual_seed(0)
    scores, values = torch.randn(3, 6) * 5, torch.randn(3, 6, 4)
    mask = lengths_mask([6, 2, 4], 6)
    context, weights = attend(scores, values, mask)
    assert context.shape == (3, 4) and weights.shape == (3, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    assert (weights[~mask] == 0).all()
    assert (weights[mask] > 0).all()
    # the context only depends on the unmasked values
    values2 = values.clone()
    values2[~mask] = 1e6
    torch.testing.assert_close(attend(scores, values2, mask)[0], context)


def test_fully_masked_row_gives_zeros_not_nan():
    scores = torch.randn(2, 5, requires_grad=True)
    mask = torch.tensor([[True, True, False, False, False], [False] * 5])
    context, weights = attend(scores, torch.randn(2, 5, 3), mask)
    assert not torch.isnan(weights).any() and not torch.isnan(context).any()
    assert (weights[1] == 0).all() and (context[1] == 0).all()
    context.sum().backward()
    assert not torch.isnan(scores.grad).any()
    # and with no mask at all, a plain softmax
    torch.testing.assert_close(masked_softmax(scores, torch.ones(2, 5, dtype=torch.bool)), scores.softmax(-1))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("b,s,t", [(1, 3, 4), (4, 7, 2), (5, 11, 12)])
def test_model_shapes(b, s, t, bidirectional):
    torch.manual_seed(0)
    config = dataclasses.replace(SMALL, bidirectional=bidirectional)
    v_src, v_tgt = 9, 11
    src = torch.randint(3, v_src, (b, s))
    lengths = torch.full((b,), s)
    lengths[0] = max(1, s - 2)
    src[0, lengths[0] :] = 0
    tgt_in = torch.randint(1, v_tgt, (b, t))
    enc = Encoder(v_src, 8, 12, bidirectional)
    states, final = enc(src, lengths)
    width = 24 if bidirectional else 12
    assert states.shape == (b, s, width) and final.shape == (b, width)
    assert (states[0, lengths[0] :] == 0).all()
    for kind in ("plain", "attention"):
        model = build_seq2seq(config, v_src, v_tgt, kind)
        logits, weights = model.forward_with_weights(src, lengths, tgt_in)
        assert logits.shape == (b, t, v_tgt)
        tokens, gweights = model.greedy_decode(src, lengths, max_len=t)
        assert tokens.shape[0] == b and 1 <= tokens.shape[1] <= t
        if kind == "attention":
            assert weights.shape == (b, t, s)
            torch.testing.assert_close(weights.sum(-1), torch.ones(b, t))
            assert (weights[0, :, lengths[0] :] == 0).all()
            assert gweights.shape == (b, tokens.shape[1], s)
        else:
            assert weights is None and gweights is None


@pytest.mark.parametrize("kind", ["plain", "attention"])
def test_padding_does_not_change_outputs(kind):
    torch.manual_seed(0)
    vocab = reversal_vocab(6)
    model = build_seq2seq(SMALL, len(vocab), len(vocab), kind).eval()
    short, long = ("abc", "cba"), ("abcdefabcdef", "fedcbafedcba")
    alone = make_batch([short], vocab, vocab)
    padded = make_batch([short, long], vocab, vocab)
    assert padded.src.shape[1] > alone.src.shape[1]
    with torch.no_grad():
        logits_alone, w_alone = model.forward_with_weights(alone.src, alone.src_lengths, alone.tgt_in)
        logits_pad, w_pad = model.forward_with_weights(padded.src, padded.src_lengths, padded.tgt_in)
        t, s = alone.tgt_in.shape[1], alone.src.shape[1]
        torch.testing.assert_close(logits_pad[0, :t], logits_alone[0], atol=1e-5, rtol=1e-5)
        states_alone, final_alone = model.encoder(alone.src, alone.src_lengths)
        states_pad, final_pad = model.encoder(padded.src, padded.src_lengths)
        torch.testing.assert_close(states_pad[0, :s], states_alone[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(final_pad[0], final_alone[0], atol=1e-6, rtol=1e-5)
        if kind == "attention":
            torch.testing.assert_close(w_pad[0, :t, :s], w_alone[0], atol=1e-6, rtol=1e-5)
            assert (w_pad[0, :, s:] == 0).all()
        tok_alone, _ = model.greedy_decode(alone.src, alone.src_lengths, max_len=6)
        tok_pad, _ = model.greedy_decode(padded.src, padded.src_lengths, max_len=6)
        assert tok_pad[0, : tok_alone.shape[1]].tolist() == tok_alone[0].tolist()


def test_attention_decoder_step_matches_teacher_forcing():
    """Greedy decoding fed the teacher-forced tokens reproduces forward()'s argmax."""
    torch.manual_seed(0)
    vocab = reversal_vocab(6)
    model = build_seq2seq(SMALL, len(vocab), len(vocab), "attention").eval()
    batch = make_batch([("abcab", "bacba")], vocab, vocab)
    with torch.no_grad():
        logits, weights = model.forward_with_weights(batch.src, batch.src_lengths, batch.tgt_in)
        tokens, gweights = model.greedy_decode(batch.src, batch.src_lengths, max_len=1)
    assert tokens[0, 0] == logits[0, 0].argmax()
    torch.testing.assert_close(gweights[0, 0], weights[0, 0])


def test_attention_step_queries_with_the_state_before_the_update():
    """Bahdanau's order (notebook 02): the weights of step i come from s_{i-1}, not from the new s_i."""
    torch.manual_seed(0)
    decoder = build_seq2seq(SMALL, 9, 9, "attention").decoder
    enc_states, state = torch.randn(2, 5, 24), torch.randn(2, 12)
    mask = lengths_mask([5, 3], 5)
    keys = decoder.scorer.precompute(enc_states)
    with torch.no_grad():
        new_state, context, _, weights = decoder.step(torch.tensor([3, 4]), state, enc_states, keys, mask)
        _, before = attend(decoder.scorer.score(state, keys), enc_states, mask)
        _, after = attend(decoder.scorer.score(new_state, keys), enc_states, mask)
    torch.testing.assert_close(weights, before)
    assert not torch.allclose(weights, after, atol=1e-4)
    torch.testing.assert_close(context, torch.einsum("bs,bsd->bd", weights, enc_states))


def test_decoders_are_the_expected_classes():
    config = SMALL
    assert isinstance(build_seq2seq(config, 9, 9, "plain").decoder, PlainDecoder)
    model = build_seq2seq(config, 9, 9, "attention")
    assert isinstance(model, Seq2Seq) and isinstance(model.decoder, AttentionDecoder)
    assert isinstance(model.decoder.scorer, AdditiveScore)
    from course_utils.blocks.transformer import TransformerSeq2Seq

    assert isinstance(build_seq2seq(config, 9, 9, "transformer"), TransformerSeq2Seq)
    with pytest.raises(ValueError, match="'plain', 'attention' or 'transformer'"):
        build_seq2seq(config, 9, 9, "lstm")


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMALL.hidden_size = 3


def test_learning_rate_schedule():
    config = Seq2SeqConfig(lr=1e-2, warmup_steps=10, steps=110, min_lr_frac=0.1)
    assert learning_rate(0, config) == pytest.approx(1e-3)
    assert learning_rate(9, config) == pytest.approx(1e-2)
    assert learning_rate(10, config) == pytest.approx(1e-2)
    assert learning_rate(110, config) == pytest.approx(1e-3)
    assert learning_rate(60, config) == pytest.approx(0.55e-2)
    constant = dataclasses.replace(config, lr_decay="constant")
    assert learning_rate(100, constant) == pytest.approx(1e-2)


def test_training_is_deterministic_and_reduces_loss(capsys):
    vocab = reversal_vocab(6)
    data = make_batch(make_reversal_pairs(64, 3, 6, n_symbols=6, seed=0), vocab, vocab)
    config = dataclasses.replace(SMALL, steps=30, batch_size=16, lr=1e-2, warmup_steps=1, log_every=10)
    runs = []
    for _ in range(2):
        torch.manual_seed(config.seed)
        model = build_seq2seq(config, len(vocab), len(vocab), "attention")
        runs.append((train(model, data, config, progress=True), model))
    (first, model), (second, _) = runs
    assert first.losses == second.losses
    assert first.steps == len(first.losses) == 30 and first.seconds > 0
    assert sum(first.losses[-5:]) < sum(first.losses[:5])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("step    10  loss ")
    assert out.count("\n") == 6 and "s/" not in out  # 3 lines per run, no timings
    accuracy = accuracy_by_length(model, make_reversal_pairs(20, 3, 6, n_symbols=6, seed=1), vocab, vocab)
    assert set(accuracy) <= set(range(3, 7)) and all(0 <= a <= 1 for a in accuracy.values())


def test_train_is_silent_without_progress(capsys):
    vocab = reversal_vocab(6)
    data = make_batch(make_reversal_pairs(16, 3, 5, n_symbols=6), vocab, vocab)
    torch.manual_seed(0)
    train(build_seq2seq(SMALL, len(vocab), len(vocab), "plain"), data, SMALL)
    assert capsys.readouterr().out == ""


def test_exact_match_requires_eos_at_the_right_place():
    vocab = reversal_vocab(6)

    class Fixed(torch.nn.Module):
        """A fake model whose greedy output is fixed."""

        def __init__(self, tokens):
            super().__init__()
            self.tokens = tokens

        def greedy_decode(self, src, src_lengths, max_len):
            return self.tokens[:, :max_len], None

    data = make_batch([("ab", "ba"), ("ab", "ba"), ("ab", "ba")], vocab, vocab)
    b, a, eos = vocab.stoi["b"], vocab.stoi["a"], vocab.eos_id
    tokens = torch.tensor([[b, a, eos, a], [b, a, a, eos], [b, b, eos, eos]])
    assert exact_match(Fixed(tokens), data).tolist() == [True, False, False]


def test_run_length_experiment_small():
    config = dataclasses.replace(
        SMALL, min_len=3, max_len=5, n_train=64, n_test_per_length=4, steps=3, batch_size=8
    )
    result = run_length_experiment(config, decoder="attention")
    assert sorted(result.accuracy) == [3, 4, 5]
    assert len(result.test_pairs) == 12
    assert result.train.steps == 3 and len(result.train.losses) == 3
    assert 0 <= result.overall <= 1
    dates = run_length_experiment(dataclasses.replace(config, task="dates"), decoder="plain")
    assert len(dates.test_pairs) == 40 and all(len(t) == 10 for _, t in dates.test_pairs)


def test_final_states_equal_the_packed_gru_final_state():
    """final_states picks the state after the last real token: what a packed GRU returns as h_n."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from course_utils.blocks.seq2seq import final_states

    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 6, batch_first=True)
    x = torch.randn(3, 5, 4)
    lengths = torch.tensor([5, 2, 3])
    states, _ = gru(x)  # (B, S, H); positions past a length hold states of padding
    _, h_n = gru(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    torch.testing.assert_close(final_states(states, lengths), h_n[0])
    assert not torch.allclose(states[:, -1], h_n[0])  # the classic bug differs


def test_sequence_exact_match_ignores_padding_and_needs_every_real_token():
    from course_utils.experiments.training import sequence_exact_match

    targets = torch.tensor([[5, 6, 2, 0], [5, 6, 7, 2], [5, 2, 0, 0]])
    tokens = torch.tensor([[5, 6, 2, 9], [5, 6, 7, 3], [5, 2, 0, 4]])
    assert sequence_exact_match(tokens, targets).tolist() == [True, False, True]


def test_plain_greedy_decode_is_what_seq2seq_runs_and_steps_match_teacher_forcing():
    """Notebook 01 writes out plain_greedy_decode; Seq2Seq.greedy_decode runs exactly it for a plain decoder."""
    from course_utils.blocks.seq2seq import plain_greedy_decode

    torch.manual_seed(0)
    vocab = reversal_vocab(6)
    model = build_seq2seq(SMALL, len(vocab), len(vocab), "plain").eval()
    batch = make_batch([("abcab", "bacba"), ("fed", "def")], vocab, vocab)
    tokens, weights = model.greedy_decode(batch.src, batch.src_lengths, max_len=8)
    alone = plain_greedy_decode(model.encoder, model.decoder, batch.src, batch.src_lengths, 8)
    assert weights is None and torch.equal(tokens, alone)
    with torch.no_grad():  # one step at a time, fed the true previous tokens = one teacher-forced call
        _, context = model.encoder(batch.src, batch.src_lengths)
        logits, _ = model.decoder(batch.tgt_in, context)
        state, stepped = model.decoder.initial_state(context), []
        for i in range(batch.tgt_in.shape[1]):
            step_logits, state = model.decoder.step(batch.tgt_in[:, i], state, context)
            stepped.append(step_logits)
    torch.testing.assert_close(torch.stack(stepped, dim=1), logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_encoder_context_is_the_packed_grus_own_final_state(bidirectional):
    """The encoder reads c from its states with final_states (notebook 01's exercise 1): exactly the GRU's h_n."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    encoder = Encoder(9, 5, 6, bidirectional=bidirectional)
    src = torch.randint(3, 9, (4, 7))
    lengths = torch.tensor([7, 1, 4, 2])
    src[torch.arange(7)[None, :] >= lengths[:, None]] = 0  # right padding
    states, context = encoder(src, lengths)
    _, h_n = encoder.gru(pack_padded_sequence(encoder.embedding(src), lengths, batch_first=True, enforce_sorted=False))
    assert torch.equal(context, torch.cat(list(h_n), dim=-1))  # bit for bit: the models of 01 and 02 train as before
    assert context.shape == (4, 12 if bidirectional else 6)


def test_train_runs_train_step_or_the_step_it_is_given():
    """training.train calls train_step (the step notebook 01 shows) once per step, or the step passed to it."""
    from course_utils.experiments.training import train_step

    vocab = reversal_vocab(6)
    data = make_batch(make_reversal_pairs(16, 3, 5, 6, seed=0), vocab, vocab)
    config = dataclasses.replace(SMALL, steps=4, batch_size=4)
    runs, calls = [], []

    def counted(*args):
        calls.append(args[3])  # the learning rate of this step
        return train_step(*args)

    for step in (None, counted):
        torch.manual_seed(0)
        model = build_seq2seq(config, len(vocab), len(vocab), "plain")
        runs.append(train(model, data, config, step=step) if step else train(model, data, config))
    assert runs[0].losses == runs[1].losses and len(runs[0].losses) == 4
    assert calls == [learning_rate(k, config) for k in range(4)]
