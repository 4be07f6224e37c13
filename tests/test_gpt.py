"""Notebooks 10 and 11: the small GPT, its KV cache and grouped-query attention, the corpus, the training helpers,
the attention patterns read for induction heads, the checkers."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch
import torch.nn.functional as F

from course_utils.blocks import gpt, masks, transformer
from course_utils.blocks.multihead import merge_heads, split_heads
from course_utils.checks import CheckError, check_attend_with_cache, check_filter_logits, check_next_token_loss
from helpers import notebook_solution
from course_utils.core.errors import InputError
from course_utils.experiments import language_model as lm
from course_utils.experiments.data import DATA_DIR


# --- the shipped corpus ------------------------------------------------------


def test_corpus_matches_the_sha256_and_size_in_data_readme():
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    row = re.search(r"^\| `devils_dictionary.txt` \| ([\d,]+) \| ([\d,]+) \| `([0-9a-f]{64})` \|", readme, re.M)
    assert row, "data/README.md has no row for devils_dictionary.txt"
    raw = lm.CORPUS.read_bytes()
    assert (int(row[1].replace(",", "")), int(row[2].replace(",", "")), row[3]) == (
        len(raw.decode("ascii")), len(raw), hashlib.sha256(raw).hexdigest())


def test_corpus_is_the_entries_with_runs_of_spaces_collapsed():
    text = lm.load_devils_dictionary()
    assert text.startswith("ABASEMENT, n.  ".replace("  ", " ")) and text.rstrip().endswith("every two years.")
    assert "  " not in text and not re.search(r" $", text, re.M), "runs of spaces collapse, line ends are trimmed"
    assert "\t" not in text and "\r" not in text and "00-database" not in text
    assert len(set(text)) == 83
    assert len(re.findall(r"^[A-Z][A-Z' -]*, [a-z.]+ ", text, re.M)) > 900  # about 1,000 entries


# --- the model ---------------------------------------------------------------


def test_gpt_block_with_g_equal_h_is_the_pre_ln_block_of_07_under_a_causal_mask():
    torch.manual_seed(0)
    ours = gpt.GPTBlock(32, 4, 64).eval()
    theirs = transformer.TransformerEncoderBlock(32, 4, 64, norm_first=True, activation="gelu").eval()
    theirs.load_state_dict(ours.state_dict())  # same names and shapes
    x = torch.randn(3, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x, mask=masks.causal_mask(9)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("H", "G"), [(4, 4), (4, 2), (4, 1), (6, 3), (1, 1)])
def test_grouped_attention_matches_pytorch_enable_gqa(H, G):
    g = torch.Generator().manual_seed(H * 10 + G)
    q, k, v = torch.randn(2, H, 7, 8, generator=g), torch.randn(2, G, 7, 8, generator=g), torch.randn(2, G, 7, 8, generator=g)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(gpt.grouped_attention(q, k, v, masks.causal_mask(7)), expected, atol=1e-5, rtol=1e-5)


def test_mqa_has_one_key_and_value_head_and_smaller_projections():
    mqa, mha = gpt.GroupedQueryAttention(64, 8, 1), gpt.GroupedQueryAttention(64, 8)
    assert mqa.k_proj.weight.shape == (8, 64) and mha.k_proj.weight.shape == (64, 64)
    with pytest.raises(InputError, match="not divisible by num_groups"):
        gpt.GroupedQueryAttention(64, 8, 3)
    with pytest.raises(InputError, match="not divisible by num_heads"):
        gpt.GroupedQueryAttention(60, 8)


@pytest.mark.parametrize("G", [4, 2, 1])
def test_cached_decoding_equals_a_full_recompute(G):
    torch.manual_seed(G)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=13, max_len=24, d_model=32, num_groups=G)).eval()
    tokens = torch.randint(0, 13, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        logits, caches = model.forward_cached(tokens[:, :6])
        pieces = [logits]
        for i in range(6, 20):
            logits, caches = model.forward_cached(tokens[:, i:i + 1], caches)
            pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert caches[0][0].shape == (2, G, 20, 8) and len(caches) == 3
    with pytest.raises(InputError, match="exceed the context"):
        model.forward_cached(tokens[:, :5], caches)


def test_generate_with_and_without_cache_draws_the_same_tokens():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=11, max_len=30, d_model=32)).eval()
    prompt = torch.randint(0, 11, (2, 3))
    for kwargs in ({"temperature": 0.0}, {"temperature": 0.9, "top_k": 4}, {"temperature": 1.2, "top_p": 0.8}):
        a = gpt.generate_with_cache(model, prompt, 20, generator=torch.Generator().manual_seed(1), **kwargs)
        b = gpt.generate(model, prompt, 20, generator=torch.Generator().manual_seed(1), **kwargs)
        assert torch.equal(a, b) and a.shape == (2, 23) and torch.equal(a[:, :3], prompt)


def test_generate_with_cache_samples_through_the_filter_it_is_given():
    # notebook 10 passes the learner's filter_logits; a filter that keeps only token 3 must decide every draw
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=11, max_len=8, d_model=16, num_layers=1)).eval()
    prompt = torch.randint(0, 11, (2, 3))

    def only_three(logits, top_k, top_p):
        return torch.full_like(logits, float("-inf")).index_fill(-1, torch.tensor([3]), 0.0)

    out = gpt.generate_with_cache(model, prompt, 12, top_k=5, generator=torch.Generator().manual_seed(0),
                                  filter_fn=only_three)
    assert (out[:, 3:] == 3).all()


def test_generate_slides_its_window_and_the_cache_restarts_beyond_max_len():
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=11, max_len=8, d_model=16, num_layers=1)).eval()
    prompt = torch.randint(0, 11, (2, 3))
    out = gpt.generate(model, prompt, 20, temperature=0.0)  # 23 tokens through a context of 8
    with torch.no_grad():
        for t in range(3, 23):  # each token is the argmax after the last 8 tokens before it
            assert torch.equal(out[:, t], model(out[:, max(0, t - 8):t])[:, -1].argmax(-1))
    cached = gpt.generate_with_cache(model, prompt, 20, temperature=0.0)
    assert cached.shape == (2, 23) and torch.equal(cached[:, :9], out[:, :9])  # the same while the text fits


def test_output_layer_is_tied_to_the_token_embedding():
    model = gpt.GPT(gpt.GPTConfig(vocab_size=11, max_len=8, d_model=16, num_layers=1))
    names = [n for n, _ in model.named_parameters()]
    assert not any("out." in n or n.startswith("lm_head") for n in names)
    tokens = torch.randint(0, 11, (1, 5))
    gpt.next_token_loss(model, torch.randint(0, 11, (1, 6))).backward()
    assert model.token_embedding.weight.grad[tokens].abs().sum() > 0
    assert model(tokens).shape == (1, 5, 11)


def test_kv_cache_bytes_per_token():
    assert gpt.kv_cache_bytes_per_token(32, 32, 128, 2) == 2 * 32 * 32 * 128 * 2 == 524288
    assert gpt.kv_cache_bytes_per_token(32, 8, 128, 2) * 4 == gpt.kv_cache_bytes_per_token(32, 32, 128, 2)


# --- the training helpers -----------------------------------------------------


def test_warmup_cosine_rises_then_decays_to_the_floor():
    lrs = [lm.warmup_cosine(k, 100, 1e-3, 10, 1e-4) for k in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3) and max(lrs) == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(1e-4, rel=0.01)


def test_windows_and_evaluation():
    data = torch.arange(100)
    w = lm.random_windows(data, 5, 8, torch.Generator().manual_seed(0))
    assert w.shape == (5, 9) and torch.equal(w[:, 1:] - w[:, :-1], torch.ones(5, 8, dtype=torch.long))
    e = lm.evaluation_windows(data, 9)
    assert e.shape == (11, 10) and torch.equal(e[:, 0], torch.arange(0, 99, 9)) and e[-1, -1] == 99
    model = gpt.GPT(gpt.GPTConfig(vocab_size=100, max_len=9, d_model=16, num_layers=1)).eval()
    expected = gpt.next_token_loss(model, e).item()
    assert lm.evaluate(model, e, batch_size=4) == pytest.approx(expected, rel=1e-5)


def test_adamw_decays_only_the_matrices():
    model = gpt.GPT(gpt.GPTConfig(vocab_size=11, max_len=8, d_model=16, num_layers=1))
    decayed, plain = lm.adamw_for(model, 1e-3, 0.1).param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])


def test_training_records_a_gradient_norm_per_step_and_lowers_the_loss():
    torch.manual_seed(0)
    data = torch.tensor([0, 1, 2, 3, 4, 5] * 50)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=6, max_len=8, d_model=16, num_layers=1, dropout=0.0))
    result = lm.train_language_model(model, data, lm.LMTrainConfig(steps=40, batch_size=8, length=8, warmup_steps=5))
    assert len(result.grad_norms) == len(result.losses) == len(result.lrs) == 40
    assert all(n > 0 for n in result.grad_norms) and not model.training
    assert result.losses[-1] < 0.5 * result.losses[0]


def test_decode_cost_model():
    kwargs = dict(d_model=128, num_layers=3, d_ff=512, vocab_size=83)
    with_cache = [lm.decode_madds(n, use_cache=True, **kwargs) for n in (64, 128, 256)]
    without = [lm.decode_madds(n, use_cache=False, **kwargs) for n in (64, 128, 256)]
    ratios = [b / a for a, b in zip(with_cache, without)]
    assert all(r2 > 1.9 * r1 for r1, r2 in zip(ratios, ratios[1:]))  # the saving grows about linearly with length
    assert lm.decode_madds(1, use_cache=True, **kwargs) == lm.decode_madds(1, use_cache=False, **kwargs)


# --- reading the attention patterns (induction heads) -------------------------


@pytest.mark.parametrize("G", [4, 2, 1])
def test_attention_weights_rebuild_every_blocks_attention_output(G):
    torch.manual_seed(G)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=11, max_len=16, d_model=32, num_heads=4, num_groups=G, num_layers=2)).eval()
    tokens = torch.randint(0, 11, (3, 12))
    weights = lm.attention_weights(model, tokens)
    assert weights.shape == (3, 2, 4, 12, 12), "(B, L, H, T, T)"
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 4, 12))
    assert (weights.triu(diagonal=1) == 0).all(), "causal: no weight on a later position"
    with torch.no_grad():  # the weights times each block's own values must give the block's own attention output
        x = model.token_embedding(tokens) + model.position_embedding(torch.arange(12))
        for layer, block in enumerate(model.blocks):
            attn, h = block.self_attn, block.norm1(x)
            v = split_heads(attn.v_proj(h), G).repeat_interleave(4 // G, dim=1)  # (B, G, T, Dh) -> (B, H, T, Dh)
            rebuilt = attn.out_proj(merge_heads(weights[:, layer] @ v))  # (B, T, D)
            torch.testing.assert_close(rebuilt, attn(h)[0], atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"block {layer}, G = {G}: {m}")
            x = block(x)[0]


# --- the checkers --------------------------------------------------------------


def test_checkers_accept_the_notebook_solutions(capsys):
    for seed, shape in [(0, {}), (1, {"B": 1, "T": 1, "V": 3}), (2, {"B": 4, "T": 9, "V": 5})]:
        check_next_token_loss(notebook_solution("10_small_gpt", "next_token_loss"), seed=seed, **shape)
    for seed, shape in [(0, {}), (1, {"B": 1, "V": 3}), (2, {"B": 6, "V": 50})]:
        check_filter_logits(notebook_solution("10_small_gpt", "filter_logits"), seed=seed, **shape)
    for seed, shape in [(0, {}), (1, {"B": 1, "H": 2, "G": 1, "Dh": 4}), (2, {"B": 3, "H": 3, "G": 3, "Dh": 2})]:
        check_attend_with_cache(notebook_solution("11_gpt_inference", "attend_with_cache"), seed=seed, **shape)
    assert capsys.readouterr().out.count("all checks passed") == 9


def _ce(logits, targets, **kwargs):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), **kwargs)


def _no_grad_loss(model, tokens):
    with torch.no_grad():
        return gpt.next_token_loss(model, tokens)


def _in_place_loss(model, tokens):
    tokens[:, 0] = 0
    return gpt.next_token_loss(model, tokens)


LOSS_BUGS = [
    (lambda model, t: _ce(model(t[:, :-1]), t[:, :-1]), "no shift"),
    (lambda model, t: _ce(model(t[:, 1:]), t[:, :-1]), "shifted the wrong way"),
    (lambda model, t: _ce(model(t[:, :-1]), t[:, 1:], reduction="sum"), "a sum"),
    (lambda model, t: _ce(torch.softmax(model(t[:, :-1]), -1), t[:, 1:]), "softmax applied before"),
    (lambda model, t: F.cross_entropy(model(t[:, :-1]).reshape(-1, 7), t[:, 1:].T.reshape(-1)), "different orders"),
    (lambda model, t: gpt.next_token_loss(model, t).item(), "Python float"),
    (_no_grad_loss, "no gradient"),
    (_in_place_loss, "in place"),
    (lambda model, t: _ce(model(t[:, :-1]), t[:, 1:], reduction="none"), "expected the loss of shape"),
    (lambda model, t: _ce(model(t), t), "right shape, wrong values"),  # every position scored against itself
]


@pytest.mark.parametrize(("buggy", "fragment"), LOSS_BUGS)
def test_check_next_token_loss_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_next_token_loss(buggy)
    assert fragment in str(err.value)


def _filter(keep_crossing=True, largest=True, scatter=True, off_by_one=False, probs=True, renormalise=True,
            at_least_one=True, in_place=False, as_probabilities=False):
    def fn(logits, top_k=None, top_p=None):
        out = logits if in_place else logits.clone()
        if top_k is not None:
            vals = torch.topk(out, min(top_k + off_by_one, out.shape[-1]), dim=-1, largest=largest).values[..., -1:]
            out[(out < vals) if largest else (out > vals)] = float("-inf")
        if top_p is not None:
            base = out if renormalise else logits
            sorted_logits, order = torch.sort(base, dim=-1, descending=True)
            p = torch.softmax(sorted_logits, -1) if probs else sorted_logits
            cum = p.cumsum(-1)
            drop = (cum - p >= top_p) if keep_crossing else (cum > top_p)
            if not keep_crossing and at_least_one:
                drop[..., 0] = False
            if scatter:
                drop = drop.scatter(-1, order, drop)
                out = out.masked_fill(drop, float("-inf"))
            else:
                out = sorted_logits.masked_fill(drop, float("-inf"))
        return torch.softmax(out, -1) if as_probabilities else out

    return fn


def _no_scatter_top_k(logits, top_k=None, top_p=None):
    if top_k is None:
        return gpt.filter_logits(logits, None, top_p)
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values
    return gpt.filter_logits(sorted_logits, top_k, top_p)


FILTER_BUGS = [
    (_filter(keep_crossing=False, at_least_one=False), "removed every token"),
    (_filter(keep_crossing=False), "boundary token was dropped"),
    (_filter(largest=False), "least likely"),
    (_no_scatter_top_k, "vocabulary's order"),
    (_filter(off_by_one=True), "off by one"),
    (_filter(probs=False), "sums probabilities"),
    (_filter(renormalise=False), "renormalised"),
    (_filter(in_place=True), "in place"),
    (_filter(as_probabilities=True), "returned probabilities"),
    (lambda logits, top_k=None, top_p=None: torch.log_softmax(gpt.filter_logits(logits, top_k, top_p), -1),
     "unchanged"),
    (lambda logits, top_k=None, top_p=None: gpt.filter_logits(logits, top_k, top_p).nan_to_num(0.0, neginf=-1e9)[0],
     "expected a tensor of shape"),
]


@pytest.mark.parametrize(("buggy", "fragment"), FILTER_BUGS)
def test_check_filter_logits_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_filter_logits(buggy)
    assert fragment in str(err.value)


def _cache_step(offset=True, causal=True, use_cache=True, update=True, dim=2):
    def fn(q, k, v, cache=None):
        if cache is not None:
            keys, values = torch.cat([cache[0], k], dim=dim), torch.cat([cache[1], v], dim=dim)
        else:
            keys, values = k, v
        T, S = q.shape[2], keys.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T if offset else 0) if causal else None
        if not use_cache:
            mask = None if not causal else torch.ones(T, T, dtype=torch.bool).tril()
            out = gpt.grouped_attention(q, k, v, mask)
        else:
            out = gpt.grouped_attention(q, keys, values, mask)
        return out, ((keys, values) if update else cache)

    return fn


CACHE_BUGS = [
    (_cache_step(offset=False), "not shifted by the P cached positions"),
    (_cache_step(causal=False), "no causal mask"),
    (_cache_step(use_cache=False), "cached keys and values were ignored"),
    (_cache_step(update=False), "expected a tuple"),  # returns None as the cache on the first call
    (_cache_step(dim=1), "attend_with_cache raised"),
    (lambda q, k, v, cache=None: gpt.attend_with_cache(q, k, v, cache)[0], "expected a tuple"),
]


@pytest.mark.parametrize(("buggy", "fragment"), CACHE_BUGS)
def test_check_attend_with_cache_names_the_bug(buggy, fragment):
    with pytest.raises(CheckError) as err:
        check_attend_with_cache(buggy)
    assert fragment in str(err.value)


def test_a_cache_returned_without_the_new_positions_is_named():
    def stale(q, k, v, cache=None):
        out, full = gpt.attend_with_cache(q, k, v, cache)
        return out, (cache if cache is not None else full)

    with pytest.raises(CheckError, match="without the new positions"):
        check_attend_with_cache(stale)


# --- the shipped checkpoints (notebooks 10 and 11) ---------------------------------------


@pytest.mark.parametrize("name", ["gpt_dictionary_mha.pt", "gpt_dictionary_mqa.pt", "gpt_dictionary_long.pt"])
def test_shipped_checkpoints_match_the_readme_and_load_as_a_gpt(name):
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| `{re.escape(name)}` \| ([\d,]+) \| ([\d,]+) \| `([0-9a-f]{{64}})` \|", readme, re.M)
    assert row, f"data/README.md has no row for {name}"
    raw = (DATA_DIR / name).read_bytes()
    assert (len(raw), hashlib.sha256(raw).hexdigest()) == (int(row[2].replace(",", "")), row[3])
    assert len(raw) < 2_000_000, "a shipped checkpoint stays under 2 MB"
    model = lm.load_checkpoint(DATA_DIR / name)
    assert sum(p.numel() for p in model.parameters()) == int(row[1].replace(",", ""))
    assert not model.training and all(p.dtype == torch.float32 for p in model.parameters())


def test_copy_task_repeats_a_segment_of_random_length_and_marks_the_copyable_positions():
    config = lm.InductionConfig()
    tokens, copyable, lag = lm.copy_task(1000, config, torch.Generator().manual_seed(0))
    T = config.length
    assert tokens.shape == (1000, T + 1) and copyable.shape == (1000, T) and lag.shape == (1000,)
    lengths, gaps = set(), set()
    for row, marks, distance in zip(tokens, copyable, lag.tolist()):
        queries = marks.nonzero().flatten()  # the second copy's first n - 1 positions
        n, second = len(queries) + 1, int(queries[0])
        first = second - distance
        lengths.add(n)
        gaps.add(distance - n)
        assert first >= 0 and torch.equal(row[second:second + n], row[first:first + n])
        assert torch.equal(row[queries - distance + 1], row[queries + 1]), "the induction position holds the next token"
    assert lengths == set(range(config.min_n, config.max_n + 1)), "every segment length occurs"
    assert gaps == set(range(config.max_gap + 1)), "every gap occurs"
