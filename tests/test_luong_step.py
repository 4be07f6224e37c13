"""Luong et al.'s (2015, §3) decoder step, the reference of notebook 02's exercise 4."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.blocks import scorers, seq2seq


def _parts(score="additive", B=3, S=5, R=6, Dk=8, A=7, embed_size=4, seed=0):
    """A scorer and the arguments of luong_step, as a tuple (scorer, args)."""
    torch.manual_seed(seed)
    cell, scorer = nn.GRUCell(embed_size, R), scorers.make_scorer(score, R, Dk, A)
    W_c = torch.randn(R, Dk + R)
    emb, state, enc_states = torch.randn(B, embed_size), torch.randn(B, R), torch.randn(B, S, Dk)
    lengths = torch.tensor([S] + [max(1, S - 2)] * (B - 1))
    mask = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    return scorer, (emb, state, enc_states, scorer.precompute(enc_states), mask, cell, scorer.score, W_c)


@pytest.mark.parametrize(("score", "R", "Dk"), [("additive", 6, 8), ("concat", 6, 8), ("bilinear", 5, 3),
                                                ("dot", 6, 6)])
def test_luong_step_equals_eq_5_written_one_sequence_at_a_time(score, R, Dk):
    _, args = _parts(score, R=R, Dk=Dk)
    emb, state, enc_states, keys, mask, cell, score_fn, W_c = args
    with torch.no_grad():
        got = seq2seq.luong_step(*args)
        for b in range(emb.shape[0]):
            s = cell(emb[b:b + 1], state[b:b + 1])[0]  # h_t = RNN(h_{t-1}, y_{t-1}), before attending
            real = mask[b]
            a = torch.softmax(score_fn(s[None], keys[b:b + 1, real])[0], dim=0)  # eq. 7, over the real positions
            c = a @ enc_states[b, real]  # c_t = sum_s a_t(s) h_s
            h_tilde = torch.tanh(W_c @ torch.cat([c, s]))  # eq. 5: tanh(W_c [c_t; h_t])
            for name, value, want in (("state", got[0][b], s), ("context", got[1][b], c),
                                      ("attentional", got[2][b], h_tilde), ("weights", got[3][b, real], a)):
                torch.testing.assert_close(value, want, msg=f"{name} of sequence {b}")
            assert (got[3][b, ~real] == 0).all()


def test_luong_weights_depend_on_the_previous_symbol_and_the_state_not_on_the_source():
    scorer, args = _parts()
    emb, state, _, _, mask, cell, score, W_c = args
    other = torch.randn_like(args[2])  # another source
    with torch.no_grad():
        s, _, _, w = seq2seq.luong_step(*args)
        _, _, _, w_other_symbol = seq2seq.luong_step(emb + 1, *args[1:])
        s_other_source, _, _, _ = seq2seq.luong_step(emb, state, other, scorer.precompute(other), mask, cell, score,
                                                     W_c)
    assert not torch.allclose(w_other_symbol, w)  # the query s_i has read y_{i-1}
    assert torch.equal(s_other_source, s)  # without input feeding, nothing read reaches the recurrent state


def test_luong_step_with_one_source_position_puts_all_weight_on_it():
    _, args = _parts(S=1)
    with torch.no_grad():
        _, context, _, weights = seq2seq.luong_step(*args)
    assert torch.equal(weights, torch.ones(3, 1))
    torch.testing.assert_close(context, args[2][:, 0])
