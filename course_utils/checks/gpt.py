"""Checkers for notebooks 10 and 11: the shifted next-token loss, top-k/top-p filtering (10), one KV-cache step (11)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from course_utils.blocks import gpt
from course_utils.checks.core import (call, check_close, check_tensor, describe, passed, reference_guard, shape_cases,
                                     sweep)
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


def _tiny_model(V: int, max_len: int, seed: int) -> gpt.GPT:
    torch.manual_seed(seed)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=V, max_len=max_len, d_model=8, num_heads=2, num_layers=1, d_ff=16,
                                  dropout=0.0))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.5)  # larger than GPT-2's 0.02, so that the predictions differ from position to position
    return model


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


_CLASSES = ("the (B, T, V) logits went to F.cross_entropy as they are. It reads the classes from dimension 1 of a "
            "3-D input, here the T positions, not the V vocabulary entries, so the targets were scored against the "
            "wrong axis (the shift itself is right). Either flatten the logits to (B·T, V) and the targets to (B·T,), "
            "or move the vocabulary to dimension 1, (B, V, T)")


def _classes_on_dimension_1(fn: Callable[..., Any], seed: int) -> bool:
    """Whether ``fn`` computes the loss with the (B, T, V) logits as they are, classes read from dimension 1.

    With T != V that raises a shape error; here T = V, so it runs, and gives that value."""
    g = torch.Generator().manual_seed(seed)
    model = _tiny_model(4, 4, seed)  # a context of T = 4 positions, as in the exercise
    tokens = torch.randint(0, 4, (3, 5), generator=g)  # B = 3, T = V = 4
    try:
        got = call(fn, model, tokens, name="next_token_loss")
        with torch.no_grad():
            wrong = F.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
            right = gpt.next_token_loss(model, tokens)
    except CheckError:
        return False
    return (isinstance(got, torch.Tensor) and got.shape == () and torch.allclose(got.detach(), wrong, atol=1e-5)
            and not torch.allclose(wrong, right, atol=1e-5))


_WHOLE_WINDOW = ("the model was run on the whole window of T + 1 = {T1} tokens, and its last position dropped "
                 "afterwards. The model's context holds T = {T} positions, so it cannot read the window's last token, "
                 "which is only ever a target: the notebook's model, with a context of 64, raises on windows of 65. "
                 "Give the model the T tokens whose next token it predicts")


def _reads_the_whole_window(fn: Callable[..., Any], seed: int, B: int, T: int, V: int) -> bool:
    """Whether ``fn`` runs the model on all T + 1 tokens and drops the last position: with a context of T + 1
    it then returns the right loss (a causal model's first T positions do not see the last token)."""
    g = torch.Generator().manual_seed(seed)
    model = _tiny_model(V, T + 1, seed)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    try:
        got = call(fn, model, tokens, name="next_token_loss")
    except CheckError:
        return False
    with torch.no_grad():
        right = gpt.next_token_loss(model, tokens)
    return isinstance(got, torch.Tensor) and got.shape == () and torch.allclose(got.detach(), right, atol=1e-5)


@exercise_check
def check_next_token_loss(fn: Callable[..., Any], seed: int = 0, B: int = 3, T: int = 5, V: int = 7) -> None:
    """Check a learner's ``next_token_loss(model, tokens)`` (notebook 10, exercise 1).

    Runs it on a small causal model and windows of T + 1 random tokens;
    compares the loss and its gradient with respect to every parameter. The
    model's context is T positions, exactly what the model reads (as the
    notebook trains a context of 64 on windows of 65), so an answer that runs the
    model on the whole window fails as it would in the notebook, and is named.
    At the sizes asked for, then at B = 1, T = 1 and sizes that all differ.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    with reference_guard(fn, gpt.next_token_loss):
        sweep(lambda B, T, V: _next_token_loss_once(fn, seed, B, T, V),
              shape_cases({"B": B, "T": T, "V": V}, ones=("B", "T"), distinct={"B": 3, "T": 5, "V": 7}))
    passed("next_token_loss")


def _next_token_loss_once(fn: Callable[..., Any], seed: int, B: int, T: int, V: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    model = _tiny_model(V, T, seed)  # its context: the T tokens it reads, not the T + 1 of a window
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    copy = tokens.clone()
    expected = gpt.next_token_loss(model, tokens)
    expected_grads = torch.autograd.grad(expected, list(model.parameters()))
    with torch.no_grad():
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = model(inputs)  # (B, T, V)
        suspects = {
            "the targets are the inputs themselves (no shift): position i must be scored against token i + 1":
                _cross_entropy(logits, inputs),
            "shifted the wrong way: the model must read tokens 0 .. T - 1 and predict tokens 1 .. T":
                _cross_entropy(model(tokens[:, 1:]), tokens[:, :-1]),
            "a sum over the predictions instead of their mean":
                _cross_entropy(logits, targets) * B * T,
            "softmax applied before the cross-entropy, which applies log-softmax itself: pass the logits":
                _cross_entropy(torch.softmax(logits, dim=-1), targets),
        }
        if T == V:  # else F.cross_entropy raises
            suspects[_CLASSES] = F.cross_entropy(logits, targets)
        if B > 1 and T > 1:
            suspects["the logits and the targets are flattened in different orders (one of them transposed)"] = \
                F.cross_entropy(logits.reshape(-1, V), targets.T.reshape(-1))
    try:
        got = call(fn, model, tokens, name="next_token_loss", expected="a scalar tensor, the mean loss",
                   error_hint="tokens is (B, T + 1); the model takes (B, T) ids and returns (B, T, V) logits")
    except CheckError:
        if _classes_on_dimension_1(fn, seed):
            raise CheckError(_CLASSES) from None
        if _reads_the_whole_window(fn, seed, B, T, V):
            raise CheckError(_WHOLE_WINDOW.format(T=T, T1=T + 1)) from None
        raise
    if not torch.equal(tokens, copy):
        raise CheckError("next_token_loss changed tokens in place: slice it, do not write into it")
    if isinstance(got, float):
        raise CheckError("next_token_loss returned a Python float: return the tensor (no .item()), so that "
                         "loss.backward() can train the model")
    check_tensor(got, name="the loss", shape="", dims={}, dtype=torch.float32)
    check_close(got.detach(), expected.detach(), name="the loss", suspects=suspects,
                hint="the value differs: check which tokens the model reads, which token each position is scored "
                     "against, and how you average")
    if got.grad_fn is None:
        raise CheckError("the loss has no gradient: it was detached from the model (torch.no_grad, .detach(), "
                         ".data, .item() or a tensor rebuilt from numbers)")
    grads = torch.autograd.grad(got, list(model.parameters()), allow_unused=True)
    for (name, _), grad, want in zip(model.named_parameters(), grads, expected_grads):
        if grad is None:
            raise CheckError(f"the loss does not depend on the model's parameter {name}: is every prediction "
                             "computed by the model from its inputs?")
        check_close(grad, want, name=f"the gradient of the loss for {name}",
                    hint="the value is right but the gradient is not: is part of the computation detached?")


def _nucleus_size(logits: torch.Tensor, p: float) -> torch.Tensor:
    return torch.isfinite(gpt.filter_logits(logits, top_p=p)).sum(-1)


@exercise_check
def check_filter_logits(fn: Callable[..., Any], seed: int = 0, B: int = 4, V: int = 10) -> None:
    """Check a learner's ``filter_logits(logits, top_k=None, top_p=None)`` (notebook 10, exercise 2).

    Tries neither (the logits unchanged), top-k alone (k = 1, a middle k, k = V),
    top-p alone (p close to 0, middle values, p = 1), both together, a single
    row of shape (V,) and a (2, B, V) batch, and compares which tokens stay,
    their values and that ``logits`` is unchanged. Both together also on rows
    designed so that the order matters (:func:`_order_case`): top-p on the
    softmax of the k logits left by top-k keeps fewer tokens than top-p on the
    original distribution, which is what top-p applied before top-k, or after it
    without renormalising, measures.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(B, V, generator=g)  # distinct values: no ties at the boundary
    k_mid = max(1, V // 3)
    cases = [(1, None), (k_mid, None), (V, None), (None, 1e-4), (None, 0.5), (None, 0.9), (None, 1.0), (k_mid, 0.6),
             (None, None)]
    batches = 2.0 * torch.randn(2, B, V, generator=g)  # (..., V) with two leading axes

    def check_once(rows: torch.Tensor) -> None:
        for top_k, top_p in (cases if rows is logits else [(k_mid, None), (None, 0.7)]):
            _check_filter_case(fn, rows, top_k, top_p)
        if V >= 3:
            _check_filter_case(fn, *_order_case(tuple(rows.shape), seed))

    leading = ("the code assumes a fixed number of axes: the vocabulary is the last one, whatever the number of "
               "leading axes")
    with reference_guard(fn, gpt.filter_logits):
        sweep(check_once, [(f"(B, V) = {(B, V)} logits", {"rows": logits}, ""),
                           (f"a single row, (V,) = {(V,)}", {"rows": logits[0]}, leading),
                           (f"(2, B, V) = {(2, B, V)} logits", {"rows": batches}, leading)])
    passed("filter_logits")


def _order_case(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, int, float]:
    """Logits of ``shape`` (V >= 3) and (top_k, top_p) for which the order of the two filters matters.

    Every row holds the same logits, 0, -1 and V - 2 values from -1.5 down to -4, in its own
    random order. With k = 2, the softmax of the two logits left gives the most likely token
    about 0.73; the original distribution gives it at most about 0.63. A p between the two
    (rounded to 2 decimals) keeps one token when top-p follows top-k and renormalises, and two
    when top-p measures the original distribution.
    """
    V = shape[-1]
    values = torch.cat([torch.tensor([0.0, -1.0]), torch.linspace(-1.5, -4.0, V - 2)])  # (V,), distinct
    g = torch.Generator().manual_seed(seed)
    rows = values[torch.argsort(torch.rand(math.prod(shape[:-1]), V, generator=g), dim=-1)]  # (rows, V)
    first = torch.softmax(values, dim=-1)[0].item()  # the most likely token's probability, originally
    after_top_k = torch.softmax(values[:2], dim=-1)[0].item()  # and among the two left by top-k
    return rows.reshape(shape), 2, round((first + after_top_k) / 2, 2)


def _check_filter_case(fn: Callable[..., Any], logits: torch.Tensor, top_k: int | None, top_p: float | None) -> None:
    __tracebackhide__ = True  # noqa: F841
    what = ", ".join(f"{n}={v}" for n, v in (("top_k", top_k), ("top_p", top_p)) if v is not None) or "top_k=None, top_p=None"
    shape = tuple(logits.shape)
    copy = logits.clone()
    got = call(fn, logits, top_k, top_p, name="filter_logits", expected=f"filtered logits of shape {shape}",
               error_hint="logits is (..., V); top_k is an int or None, top_p a float or None")
    if not torch.equal(logits, copy):
        raise CheckError(f"filter_logits({what}) changed logits in place: use masked_fill (no underscore) or clone")
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        raise CheckError(f"filter_logits({what}): expected a tensor of shape {shape}, got {describe(got)}")
    expected = gpt.filter_logits(logits, top_k, top_p)
    keep, got_keep = torch.isfinite(expected), torch.isfinite(got)
    if got_keep.all() and (got >= 0).all() and torch.allclose(got.sum(-1), torch.ones(shape[:-1]), atol=1e-4):
        raise CheckError(f"filter_logits({what}) returned probabilities: return logits, the kept ones unchanged and "
                         "the removed ones -inf (sampling applies the softmax afterwards)")
    if torch.isnan(got).any():
        raise CheckError(f"filter_logits({what}) returned NaN: removed tokens get -inf, kept ones keep their logit")
    if (got == float("inf")).any():
        raise CheckError(f"filter_logits({what}) returned +inf: removed tokens get -inf")
    rows_keep, rows_got = keep.reshape(-1, shape[-1]), got_keep.reshape(-1, shape[-1])
    if (rows_got.sum(-1) == 0).any():
        raise CheckError(f"filter_logits({what}) removed every token of a row, so nothing can be sampled: the most "
                         "likely token always stays")
    if not torch.equal(keep, got_keep) and top_k is not None and top_p is not None:
        original = (torch.isfinite(gpt.filter_logits(logits, top_k=top_k))
                    & torch.isfinite(gpt.filter_logits(logits, top_p=top_p)))  # top-p on the original distribution
        if torch.equal(got_keep, original):
            raise CheckError(f"filter_logits({what}) keeps too many tokens: top-p summed the probabilities of the "
                             "original distribution, which is what it measures when it acts before top-k, or after "
                             "top-k without renormalising. With both, top-k acts first, and top-p works on the softmax "
                             "of the logits that are left (renormalised over those k tokens)")
    if not torch.equal(keep, got_keep):
        row = int((rows_keep != rows_got).any(-1).nonzero()[0])
        n_want, n_got = int(rows_keep[row].sum()), int(rows_got[row].sum())
        flat, kept = logits.reshape(-1, shape[-1])[row], rows_got[row]
        if n_want == n_got and set(torch.topk(-flat, n_got).indices.tolist()) == set(kept.nonzero()[:, 0].tolist()):
            hint = "it kept the least likely tokens: sort in descending order"
        elif n_want == n_got:
            hint = ("the right number of tokens, but not the most likely ones: did you return the sorted logits "
                    "without putting them back in the vocabulary's order (scatter)?")
        elif top_p is not None and n_got == n_want - 1:
            hint = "the boundary token was dropped: the kept set must reach a probability of at least p"
        elif top_p is not None and top_k is not None:
            hint = ("with both, top-k acts first and top-p works on the softmax of the logits that are left "
                    "(renormalised), not on the original distribution")
        elif top_p is not None:
            hint = "top-p sums probabilities (the softmax of the logits), in descending order"
        else:
            hint = "keep exactly the k largest logits: is the comparison off by one?"
        amount = "too many" if n_got > n_want else ("too few" if n_got < n_want else "the wrong")
        raise CheckError(f"filter_logits({what}): row {row} keeps {amount} tokens: {hint}")
    check_close(got.masked_fill(~got_keep, 0.0), expected.masked_fill(~keep, 0.0), name=f"filter_logits({what})",
                hint="the kept tokens must keep their logits unchanged (no softmax, no renormalising: "
                     "sampling applies the softmax afterwards)")


@exercise_check
def check_attend_with_cache(fn: Callable[..., Any], seed: int = 0, B: int = 2, H: int = 4, G: int = 2,
                            Dh: int = 8) -> None:
    """Check a learner's ``attend_with_cache(q, k, v, cache)`` (notebook 11, exercise).

    Tries no cache with several new positions (the causal mask), one new
    position after a cache, several new positions after a cache (the mask's
    offset), an empty cache, and decoding a sequence in pieces, which must give
    the same outputs as the whole sequence at once. At the sizes asked for,
    then at B = 1, G = 1 (one group for all heads), G = H (one group per head)
    and sizes that all differ.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    cases = shape_cases({"B": B, "H": H, "G": G, "Dh": Dh}, ones=("B", "G"), distinct={"B": 3, "H": 4, "G": 2, "Dh": 5})
    if G != H:
        cases.insert(1, (f"G = H = {H} (one group per head)", {"B": B, "H": H, "G": H, "Dh": Dh},
                         "with one group per head, query head h reads group h: check how the heads are matched "
                         "to the groups"))
    with reference_guard(fn, gpt.attend_with_cache):
        sweep(lambda B, H, G, Dh: _attend_with_cache_once(fn, seed, B, H, G, Dh), cases)
    passed("attend_with_cache")


def _attend_with_cache_once(fn: Callable[..., Any], seed: int, B: int, H: int, G: int, Dh: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)

    def qkv(T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (torch.randn(B, H, T, Dh, generator=g), torch.randn(B, G, T, Dh, generator=g),
                torch.randn(B, G, T, Dh, generator=g))

    def past(P: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(B, G, P, Dh, generator=g), torch.randn(B, G, P, Dh, generator=g)

    for label, T, P in [("no cache, 4 new positions", 4, None), ("a cache of 5 positions, 1 new", 1, 5),
                        ("a cache of 3 positions, 3 new", 3, 3), ("an empty cache (0 positions), 2 new", 2, 0)]:
        q, k, v = qkv(T)
        cache = None if P is None else past(P)
        _check_cache_case(fn, label, q, k, v, cache)
    # Decoding in pieces = attending over the whole sequence at once.
    q, k, v = qkv(6)
    whole, _ = gpt.attend_with_cache(q, k, v, None)
    outs, cache = [], None
    for lo, hi in [(0, 2), (2, 3), (3, 6)]:
        got = call(fn, q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], cache, name="attend_with_cache",
                   expected="a tuple (out, (keys, values))")
        outs.append(got[0])
        cache = got[1]
    check_close(torch.cat(outs, dim=2), whole, name="outputs decoded in pieces of 2, 1 and 3 positions",
                shape="B H T Dh", dims={"B": B, "H": H, "T": 6, "Dh": Dh},
                hint="piece by piece, with the cache, must equal the whole sequence at once")


def _heads_in_turn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, S: int) -> torch.Tensor:
    """Causal grouped attention in which query head h reads group h % G (the other order of heads)."""
    H, T, G = q.shape[1], q.shape[2], k.shape[1]
    mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    k, v = k.repeat(1, H // G, 1, 1), v.repeat(1, H // G, 1, 1)  # (B, H, S, Dh): group h % G for head h
    return gpt.grouped_attention(q, k, v, mask)


def _check_cache_case(fn: Callable[..., Any], label: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cache: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    __tracebackhide__ = True  # noqa: F841
    B, H, T, Dh = q.shape
    G = k.shape[1]
    P = 0 if cache is None else cache[0].shape[2]
    inputs = [q, k, v] + ([] if cache is None else list(cache))
    copies = [t.clone() for t in inputs]
    got = call(fn, q, k, v, cache, name="attend_with_cache", expected="a tuple (out, (keys, values))",
               error_hint="q is (B, H, T, Dh), k and v (B, G, T, Dh), the cache None or two (B, G, P, Dh) tensors; "
                          "concatenate along the positions, dim=2")
    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
        raise CheckError(f"{label}: attend_with_cache changed an input in place: return new tensors (torch.cat)")
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], tuple) and len(got[1]) == 2):
        raise CheckError(f"{label}: expected a tuple (out, (keys, values)), got {describe(got)}")
    out, (keys, values) = got
    expected, (want_k, want_v) = gpt.attend_with_cache(q, k, v, cache)
    dims = {"B": B, "G": G, "S": P + T, "Dh": Dh}
    for name, tensor, want in (("the returned keys", keys, want_k), ("the returned values", values, want_v)):
        check_tensor(tensor, name=f"{label}: {name}", shape="B G S Dh", dims=dims,
                     hints={(B, G, P, Dh): "the cache was returned without the new positions",
                            (B, G, T, Dh): "only the new positions were returned: the cache must hold all P + T"})
        check_close(tensor, want, name=f"{label}: {name}", shape="B G S Dh", dims=dims,
                    hint="the cached positions come first, then the new ones")
    suspects = {}
    S = P + T
    if P > 0:
        suspects["the mask is not shifted by the P cached positions: new query i sits at position P + i and sees "
                 "keys 0 .. P + i"] = gpt.grouped_attention(q, want_k, want_v, torch.ones(T, S, dtype=torch.bool).tril())
        suspects["the cached keys and values were ignored: attend over the cache and the new positions"] = \
            gpt.attend_with_cache(q, k, v, None)[0]
    if T > 1:
        suspects["no causal mask: a new position must not see the new positions after it"] = \
            gpt.grouped_attention(q, want_k, want_v, None)
    if 1 < G < H:  # with one group, or one per head, the two orders agree
        suspects[f"the query heads were matched to the groups in turn (head h reads group h % G, the groups "
                 f"repeated as a whole): in this course the heads of a group sit side by side, so heads 0 .. "
                 f"{H // G - 1} read group 0, the next {H // G} group 1, and so on"] = _heads_in_turn(q, want_k, want_v, S)
    check_close(out, expected, name=f"{label}: out", shape="B H T Dh", dims={"B": B, "H": H, "T": T, "Dh": Dh},
                suspects=suspects, hint="new query i sits at position P + i and may attend to keys 0 .. P + i")
