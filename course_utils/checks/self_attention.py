"""Checkers for notebook 03: scaled dot-product attention, and the top key of each query in a padded batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, masks
from course_utils.experiments import embeddings
from course_utils.checks.core import (call, check_close, check_gradients, check_tensor, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


def _sdpa_suspects(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Known mistakes in scaled dot-product attention: {message: (out, weights) that mistake gives}."""
    Dk, Dv, T, S = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
    raw = q @ k.transpose(-2, -1)  # (..., T, S)
    full = torch.ones(T, S, dtype=torch.bool) if mask is None else mask

    def attend(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return weights @ v, weights

    suspects = {
        "the scores were not scaled: divide q·k by sqrt(Dk) = sqrt(q.shape[-1])":
            attend(attention.masked_softmax(raw, mask)),
        f"the scores were divided by Dk = {Dk}, not by its square root: the standard deviation of q·k is sqrt(Dk)":
            attend(attention.masked_softmax(raw / Dk, mask)),
        f"the scores were scaled by sqrt(Dv) = sqrt({Dv}): the scale uses the key width Dk = q.shape[-1], the "
        "width the dot product sums over": attend(attention.masked_softmax(raw / Dv**0.5, mask)),
        f"the scores were scaled by sqrt(S) = sqrt({S}), the number of keys: the scale uses the key width "
        "Dk = q.shape[-1]": attend(attention.masked_softmax(raw / S**0.5, mask)),
        f"the scores were scaled by sqrt(T) = sqrt({T}), the number of queries: the scale uses the key width "
        "Dk = q.shape[-1]": attend(attention.masked_softmax(raw / T**0.5, mask)),
        "the scores were multiplied by sqrt(Dk) instead of divided": attend(attention.masked_softmax(raw * Dk**0.5, mask)),
        "the softmax ran over the queries (dim=-2): each query's weights must sum to 1 over the keys, dim=-1":
            attend(torch.softmax((raw / Dk**0.5).masked_fill(~full, float("-inf")), dim=-2).nan_to_num(0.0)),
        "each score went through a sigmoid (or exp) on its own: the weights must be a softmax, normalised over "
        "all keys of one query so that every row sums to 1":
            attend(torch.sigmoid(raw / Dk**0.5) * full),
        "the weights are exp(scores) without the division by their row sum: normalise over the keys":
            attend(torch.exp(raw / Dk**0.5) * full),
    }
    if mask is not None:
        suspects.update({
            "the mask was ignored: masked keys still get weight": attend(torch.softmax(raw / Dk**0.5, dim=-1)),
            "the mask is inverted: True = may attend, so fill the scores where ~mask with -inf":
                attend(attention.masked_softmax(raw / Dk**0.5, ~mask)),
            "masked scores were set to 0, which still gets weight exp(0): fill them with -inf":
                attend(torch.softmax((raw / Dk**0.5).masked_fill(~mask, 0.0), dim=-1)),
            "the weights were masked after the softmax, so rows no longer sum to 1: mask the scores before it":
                attend(torch.softmax(raw / Dk**0.5, dim=-1) * mask),
        })
    return suspects


@exercise_check
def check_scaled_dot_product_attention(fn: Callable[..., Any], seed: int = 0, B: int = 2, H: int = 3, T: int = 4,
                                       S: int = 5, Dk: int = 6, Dv: int = 7) -> None:
    """Check a learner's ``scaled_dot_product_attention(q, k, v, mask=None, scale=None) -> (out, weights)``.

    Notebook 03, exercise 1. Inputs are (B, H, T, Dk), (B, H, S, Dk), (B, H, S, Dv),
    three different tensors. Calls: no mask; a padding-and-causal mask; a mask
    with a fully masked row (zeros expected, not NaN); an explicit ``scale``, and
    ``scale=0.0`` with the mask (uniform weights over the allowed keys, not 1/sqrt(Dk));
    the other mask shapes the text allows ((B, 1, 1, S), (T, S), (B, H, T, S));
    scores of about ±1e4; then a backward pass. All at the sizes asked for, at
    B = 1, H = 1, T = 1, S = 1, at sizes that all differ (so a transposed
    product or a scale by the wrong dimension cannot pass by accident), and
    with 3-D (B, T, Dk) and 2-D (T, Dk) inputs.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    dims = {"B": B, "H": H, "T": T, "S": S, "Dk": Dk, "Dv": Dv}
    cases = shape_cases(dims, ones=("B", "H", "T", "S"), distinct={"B": 2, "H": 3, "T": 4, "S": 5, "Dk": 6, "Dv": 7})
    leading = "the code assumes 4-D inputs: use the last two dims, `-1`/`-2`, whatever the number of leading dims"
    cases += [(f"3-D inputs (B, T, Dk) = {(B, T, Dk)}, without a head axis", {**dims, "H": None}, leading),
              (f"2-D inputs (T, Dk) = {(T, Dk)}, one sentence without a batch axis", {**dims, "B": None, "H": None},
               leading)]
    with reference_guard(fn, attention.scaled_dot_product_attention):
        sweep(lambda B, H, T, S, Dk, Dv: _sdpa_once(fn, seed, tuple(n for n in (B, H) if n is not None), T, S, Dk, Dv),
              cases)
    passed("scaled_dot_product_attention")


def _sdpa_once(fn: Callable[..., Any], seed: int, lead: tuple[int, ...], T: int, S: int, Dk: int, Dv: int) -> None:
    """One size of the check: ``lead`` is (B, H), (B,) or () (the leading dims of q, k and v)."""
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    letters = ("B", "H")[:len(lead)]
    dims = {**dict(zip(letters, lead)), "T": T, "S": S, "Dk": Dk, "Dv": Dv}
    q = 1.5 * torch.randn(*lead, T, Dk, generator=g)
    k = 1.5 * torch.randn(*lead, S, Dk, generator=g)
    v = torch.randn(*lead, S, Dv, generator=g)
    B = lead[0] if lead else 1
    lengths = torch.full((B,), S)
    lengths[-1] = max(1, S - 2)
    padding = masks.padding_mask(lengths, S).reshape(*lead[:1], *[1] * len(lead[1:]), 1, S)  # (B, 1, 1, S), (B, 1, S) or (1, S)
    mask = padding & masks.causal_mask(T, S)  # (B, 1, T, S) for 4-D inputs
    mask[..., 0] = True  # every query may attend to key 0
    empty = mask.clone()
    blank = min(1, T - 1)  # this query of the first sequence may attend to nothing
    empty[(0,) * (empty.dim() - 2) + (blank,)] = False
    per_query = torch.rand(*lead, T, S, generator=g) < 0.6  # one pattern per head and query
    per_query[..., 0] = True
    cases = [("without a mask", (q, k, v), None), ("with a mask", (q, k, v, mask), mask),
             ("with a query whose keys are all masked", (q, k, v, empty), empty)]
    expected_scale = 0.5
    cases.append((f"with scale={expected_scale}", (q, k, v, None, expected_scale), None))
    cases.append(("with a mask and scale=0.0", (q, k, v, mask, 0.0), mask))  # every score 0: uniform weights
    for shape_letters, other in ((" ".join(letters[:1] + ("1",) * len(letters[1:]) + ("1", "S")), padding),
                                 ("T S", masks.causal_mask(T, S)), (" ".join(letters + ("T", "S")), per_query)):
        sizes = tuple(dims.get(n, 1) for n in shape_letters.split())
        cases.append((f"with a ({', '.join(shape_letters.split())}) = {sizes} mask", (q, k, v, other), other))
    shape = lambda *tail: " ".join(letters + tail)  # noqa: E731 - e.g. "B H T S"
    out_shape, weights_shape = tuple(lead) + (T, Dv), tuple(lead) + (T, S)
    copies = (q.clone(), k.clone(), v.clone(), mask.clone())
    for label, args, case_mask in cases:
        got = call(fn, *args, name="scaled_dot_product_attention",
                   expected=f"a tuple (out ({shape('T', 'Dv').replace(' ', ', ')}) = {out_shape}, "
                            f"weights ({shape('T', 'S').replace(' ', ', ')}) = {weights_shape})",
                   error_hint="q @ k.transpose(-2, -1) multiplies the last two dimensions; the mask must be bool "
                              "and broadcast to (..., T, S)")
        if not all(torch.equal(a, b) for a, b in zip((q, k, v, mask), copies)):
            raise CheckError("scaled_dot_product_attention changed an input in place (e.g. masked_fill_ with a "
                             "trailing underscore): use out-of-place operations")
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckError(f"{label}: expected a tuple (out, weights), got {describe(got)}: return out, weights")
        out, weights = got
        if (out_shape != weights_shape and isinstance(out, torch.Tensor) and tuple(out.shape) == weights_shape
                and isinstance(weights, torch.Tensor) and tuple(weights.shape) == out_shape):
            raise CheckError(f"{label}: out and weights came back in the wrong order: return (out, weights)")
        scale = args[4] if len(args) > 4 else None
        expected_out, expected_weights = attention.scaled_dot_product_attention(q, k, v, case_mask, scale)
        if (label.startswith("with a query") and isinstance(weights, torch.Tensor)
                and tuple(weights.shape) == weights_shape and torch.isnan(weights[(0,) * len(lead) + (blank,)]).any()):
            raise CheckError(
                f"{label}: that query's weights are NaN (a softmax over only -inf is 0/0). Find the queries whose "
                "mask row has no True (no allowed key) and give them zero weights after the softmax"
            )
        if scale == 0.0:
            suspects = {"with scale=0.0 they are the weights of scale=None: a test such as `scale or ...` treats 0.0 "
                        "as missing, because 0.0 is false in Python. Compare with `is None`. With scale=0.0 every "
                        "scaled score is 0, so each query's weights are uniform over its allowed keys":
                        attention.scaled_dot_product_attention(q, k, v, case_mask)}
        elif scale is not None:
            suspects = {"the `scale` argument was ignored: use it when it is given, 1/sqrt(Dk) only when it is None":
                        attention.scaled_dot_product_attention(q, k, v, case_mask)}
        else:
            suspects = _sdpa_suspects(q, k, v, case_mask)
        hints = {
            tuple(lead) + (S, T): "the weights are (..., S, T): did you compute k @ q^T? Queries index the rows: "
                                  "q @ k.transpose(-2, -1)",
            tuple(lead) + (T, Dk): "this has the width of q: did you multiply q by the weights instead of the values?",
            tuple(lead) + (T,): "one number per query: the weights keep one entry per key, (..., T, S)",
        }
        check_close(weights, expected_weights, name=f"weights ({label})", shape=shape("T", "S"), dims=dims,
                    hints=hints, suspects={m: w for m, (_, w) in suspects.items()},
                    hint="weights = softmax over the keys of (q @ k^T) * scale, with -inf where the mask is False")
        check_close(out, expected_out, name=f"out ({label})", shape=shape("T", "Dv"), dims=dims,
                    suspects={"out is the unweighted sum of the values: multiply by the weights": (
                        v.sum(-2, keepdim=True).expand(out_shape)),
                        "out averages the values uniformly: weight them by the attention weights": (
                        v.mean(-2, keepdim=True).expand(out_shape))},
                    hints={tuple(lead) + (S, Dv): "out has one row per key: it needs one per query, weights @ v",
                           weights_shape: "that is the shape of the weights: out = weights @ v"},
                    hint="out = weights @ v, one weighted average of the values per query")
    # Large scores (about ±1e4 after the scale): exp overflows float32 above about 88 without the max subtraction.
    big_q, big_k = 100 * q, 100 * k
    got = call(fn, big_q, big_k, v, mask, name="scaled_dot_product_attention", expected="a tuple (out, weights)")
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckError(f"for large scores: expected a tuple (out, weights), got {describe(got)}")
    expected_out, expected_weights = attention.scaled_dot_product_attention(big_q, big_k, v, mask)
    if any(isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all() for t in got):
        raise CheckError("out or the weights are NaN or inf for large scores (about ±1e4 after the scale): exp "
                         "overflows float32 above about 88. Subtract each row's largest score before exp "
                         "(torch.softmax does), which leaves the weights unchanged")
    check_close(got[1], expected_weights, name="weights for large scores (about ±1e4)", shape=shape("T", "S"),
                dims=dims, hint="the weights must depend only on the differences between the scores of a row")
    check_close(got[0], expected_out, name="out for large scores (about ±1e4)", shape=shape("T", "Dv"), dims=dims,
                hint="out = weights @ v")
    check_gradients(fn, (q, k, v, empty), attention.scaled_dot_product_attention,
                    name="scaled_dot_product_attention", wrt={0: "q", 1: "k", 2: "v"}, what="out and the weights",
                    seed=seed, not_finite=" (at the query whose keys are all masked?): the backward pass goes "
                                          "through that query too, and must give it a zero gradient")


def _top(x: torch.Tensor, lengths: torch.Tensor, W_q: torch.Tensor | None, W_k: torch.Tensor | None, *,
         keys: str = "real", dim: int = -1, padded_queries: int | None = -1, pick: str = "max") -> torch.Tensor:
    """Top keys computed in float64, right by default; each keyword makes one known mistake."""
    B, T, D = x.shape
    x64 = x.double()
    q = x64 if W_q is None else x64 @ W_q.double()  # (B, T, Dk)
    k = x64 if W_k is None else x64 @ W_k.double()  # (B, T, Dk)
    scores = q @ k.transpose(-2, -1)  # (B, T, T)
    positions = torch.arange(T)
    allowed = {"real": positions < lengths[:, None, None], "one more": positions <= lengths[:, None, None],
               "all": torch.ones(B, 1, T, dtype=torch.bool),
               "causal": (positions < lengths[:, None, None]) & (positions <= positions[:, None]),
               "not itself": (positions < lengths[:, None, None]) & (positions != positions[:, None])}[keys]
    sign = 1.0 if pick == "max" else -1.0
    scores = (sign * scores).masked_fill(~allowed, float("-inf"))  # (B, T, T)
    if dim == -1:
        top = scores.argmax(dim=-1)  # (B, T)
    else:  # the weights of each query, then for each key the query that gives it the largest weight
        weights = torch.softmax(scores / q.shape[-1] ** 0.5, dim=-1).nan_to_num(0.0)  # (B, T, T)
        top = weights.argmax(dim=-2)  # (B, T)
    if padded_queries is not None:
        top = top.masked_fill(positions >= lengths[:, None], padded_queries)
    return top


def _top_keys_suspects(x: torch.Tensor, lengths: torch.Tensor, W_q: torch.Tensor | None,
                       W_k: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Known mistakes in top_keys: {message: the (B, T) answer that mistake gives}."""
    suspects = {
        "a padded key won: the padding rows can hold anything, so mask the keys at and after each sentence's length "
        "before picking": _top(x, lengths, W_q, W_k, keys="all"),
        "the key at position lengths[b], the first padded one, was allowed: the real keys of sentence b are the "
        "positions 0 to lengths[b] - 1": _top(x, lengths, W_q, W_k, keys="one more"),
        "each query weighed only the keys up to its own position: this is not a decoder, so no causal mask, every "
        "real key may win": _top(x, lengths, W_q, W_k, keys="causal"),
        "a query's own key was left out: the query itself is one of the keys and may win":
            _top(x, lengths, W_q, W_k, keys="not itself"),
        "this is, for each key, the query that weighs it most: take the largest weight along the keys, the last axis":
            _top(x, lengths, W_q, W_k, dim=-2),
        "this is the key of the smallest weight: the top key has the largest": _top(x, lengths, W_q, W_k, pick="min"),
        "the padded queries got a key index: they are not tokens, give them -1":
            _top(x, lengths, W_q, W_k, padded_queries=None),
        "the padded queries got 0: give them -1, which is no key": _top(x, lengths, W_q, W_k, padded_queries=0),
    }
    if W_q is not None:
        suspects.update({
            "W_q and W_k were ignored: with projections q = x W_q and k = x W_k": _top(x, lengths, None, None),
            "q and k were swapped: the query comes from W_q (q = x W_q), the key from W_k (k = x W_k)":
                _top(x, lengths, W_k, W_q),
        })
        if W_q.shape[0] == W_q.shape[1]:  # square projections: x @ W.T and x W_q with k = x fit too
            suspects.update({
                "W_q and W_k were transposed: they are (D, Dk) and multiply from the right, q = x @ W_q (it is "
                "nn.Linear's weight that is stored transposed)": _top(x, lengths, W_q.T, W_k.T),
                "only the query was projected: the key is x W_k": _top(x, lengths, W_q, torch.eye(W_q.shape[0])),
                "only the key was projected: the query is x W_q": _top(x, lengths, torch.eye(W_q.shape[0]), W_k),
            })
    return suspects


@exercise_check
def check_top_keys(fn: Callable[..., Any], seed: int = 0, B: int = 3, T: int = 5, D: int = 6, Dk: int = 4) -> None:
    """Check a learner's ``top_keys(x, lengths, W_q=None, W_k=None) -> (B, T)`` (notebook 03, exercise 2).

    The expected answer is computed here, in float64, from random inputs: random
    sentences whose padding rows hold large random numbers (so that a key the mask
    should hide wins when it is not hidden), lengths from T down to 1 and a sentence
    of length 0, without projections and with random (D, Dk) projections. All at
    the sizes asked for, at B = 1, at T = 1, at sizes that all differ and with
    square projections (Dk = D, where a transposed projection still fits). A
    query's answer counts as right when its key's score is the largest of its row
    up to float tolerance, so an argmax of the weights and of the scores both pass.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    dims = {"B": B, "T": T, "D": D, "Dk": Dk}
    cases = shape_cases(dims, ones=("B", "T"), distinct={"B": 3, "T": 5, "D": 6, "Dk": 4})
    cases.append((f"square projections, Dk = D = {D}", {**dims, "Dk": D},
                  "W_q and W_k are (D, Dk): with Dk = D a transposed projection (or a missing one) still fits"))
    with reference_guard(fn, embeddings.top_keys):
        sweep(lambda B, T, D, Dk: _top_keys_once(fn, seed, B, T, D, Dk), cases)
    passed("top_keys")


def _top_keys_once(fn: Callable[..., Any], seed: int, B: int, T: int, D: int, Dk: int) -> None:
    """One size of the check: several batches of lengths, without and with projections."""
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    dims = {"B": B, "T": T}
    tokens = torch.randn(B, T, D, generator=g)
    garbage = 6.0 * torch.randn(B, T, D, generator=g) + 2.0  # large numbers, for the padding rows
    W_q, W_k = (torch.randn(D, Dk, generator=g) / D**0.5 for _ in range(2))
    full = torch.full((B,), T)
    steps = torch.tensor([T, max(1, T - 2), 1])  # a full sentence, a padded one, one word
    lengths = steps.repeat(B)[:B]
    empty = lengths.clone()
    empty[-1] = 0  # a sentence of length 0: every query is padding
    batches = [("a batch without padding", full), (f"lengths {lengths.tolist()} (T = {T})", lengths),
               (f"lengths {empty.tolist()}, one sentence of length 0", empty)]
    pending = None  # the first failure that names no single known mistake: a later call may name it
    for what, lens in batches:
        padding = torch.arange(T)[None, :, None] >= lens[:, None, None]  # (B, T, 1)
        x = torch.where(padding, garbage, tokens)  # (B, T, D): the padding rows hold large numbers
        copies = (x.clone(), W_q.clone(), W_k.clone())
        for projections in ((), (W_q, W_k)):
            label = f"{what}, {'with W_q and W_k' if projections else 'without projections'}"
            lens_copy = lens.clone()
            got = call(fn, x, lens, *projections, name="top_keys",
                       expected=f"a (B, T) = {(B, T)} tensor of key indices",
                       error_hint="x is (B, T, D), lengths (B,), W_q and W_k (D, Dk): q = x @ W_q has shape "
                                  "(B, T, Dk)")
            if not torch.equal(lens, lens_copy) or not all(torch.equal(a, b) for a, b in zip((x, W_q, W_k), copies)):
                raise CheckError("top_keys changed an input in place (e.g. masked_fill_ on x, or lengths modified): "
                                 "use out-of-place operations")
            try:
                _judge(got, x, lens, *(projections or (None, None)), label=label, dims=dims)
            except _Unnamed as failure:
                pending = pending or failure.args[0]
    if pending is not None:
        raise CheckError(pending)


class _Unnamed(Exception):
    """A wrong answer that matches no known mistake, or more than one, in this call (its message in args[0])."""


def _judge(got: Any, x: torch.Tensor, lengths: torch.Tensor, W_q: torch.Tensor | None, W_k: torch.Tensor | None, *,
           label: str, dims: dict[str, int]) -> None:
    """Compare one answer with the top keys computed here; name a known mistake when it makes the same answer."""
    __tracebackhide__ = True  # noqa: F841
    B, T = dims["B"], dims["T"]
    if isinstance(got, tuple):
        raise CheckError(f"{label}: expected one (B, T) tensor of key indices, got a tuple of {len(got)}: return "
                         "only the indices")
    hints = {(B, T, T): "one number per query and key: these look like the weights or the scores. Return, for each "
                        "query, the index of the key with the largest weight"}
    if B > 1 and T > 1:
        hints[(B,)] = "one number per sentence: return one key index per query, (B, T)"
    got = check_tensor(got, name=f"top keys ({label})", shape="B T", dims=dims, hints=hints)
    if got.dtype == torch.bool:
        raise CheckError(f"{label}: expected key indices (integers), got a bool tensor: return the index of each "
                         "query's top key, not whether it is the query itself")
    if got.is_floating_point() or got.is_complex():
        raise CheckError(f"{label}: expected key indices (integers), got dtype {got.dtype}: return the position of "
                         "the largest weight along the keys, not the weight itself")
    got = got.long()
    expected = _top(x, lengths, W_q, W_k)
    real = torch.arange(T) < lengths[:, None]  # (B, T)
    x64 = x.double()
    q = x64 if W_q is None else x64 @ W_q.double()
    k = x64 if W_k is None else x64 @ W_k.double()
    scores = q @ k.transpose(-2, -1)  # (B, T, T)
    valid = (got >= 0) & (got < lengths[:, None])  # (B, T): the answer is a real key
    chosen = scores.gather(-1, got.clamp(0, T - 1)[..., None])[..., 0]  # (B, T)
    best = scores.gather(-1, expected.clamp(0, T - 1)[..., None])[..., 0]  # (B, T)
    right = torch.where(real, valid & (chosen >= best - 1e-4 * (1 + best.abs())), got == -1)  # (B, T)
    if bool(right.all()):
        return
    named = [message for message, answer in _top_keys_suspects(x, lengths, W_q, W_k).items()
             if torch.equal(got, answer) and not torch.equal(answer, expected)]
    if len(named) == 1:
        raise CheckError(f"{label}: {named[0]}")
    if named:  # two mistakes give this same answer here: another call tells them apart
        raise _Unnamed(f"{label}: {named[0]}")
    b, i = (int(n) for n in (~right).nonzero()[0])
    where = f"sentence {b} (length {int(lengths[b])}), query {i}"
    if not real[b, i]:
        raise _Unnamed(f"{label}: {where} is padding, and your answer there is {int(got[b, i])}: a padded query "
                       "gets -1")
    if not valid[b, i]:
        raise _Unnamed(f"{label}: {where} got key {int(got[b, i])}, which is not a real key of that sentence: the "
                       f"real keys are 0 to {int(lengths[b]) - 1}, and the padding rows must not win")
    raise _Unnamed(f"{label}: {where} got key {int(got[b, i])}, which is not the key of largest weight. "
                     f"{int((~right).sum())} of the {int(real.sum())} real queries are off. Compute the weights of "
                     "self-attention with a padding mask (q = x W_q and k = x W_k when the projections are given) "
                     "and take the position of the largest along the keys")
