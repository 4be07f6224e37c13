"""Checkers for notebook 04: attention entropy, per-head scaled scores, the effective scale of attention code.

Each checker runs the learner's function forward and backward: a function
whose values are right but whose gradient is NaN, inf or missing (a detour
through NumPy, a ``.detach()``) would break the training that uses it.
Messages name the likely bug; they never show the solution's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, masks
from course_utils.checks.core import call, check_close, passed
from course_utils.core.errors import CheckError

_DETACHED = ("{what} have the right values but are cut off from autograd (a detour through NumPy, torch.tensor(...) "
             "or .detach()), so no gradient can flow back through them to {inputs}")


def _gradients(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], upstream: torch.Tensor, *, name: str,
               what: str, input_names: tuple[str, ...], not_finite: str = "") -> tuple[torch.Tensor, ...]:
    """Run ``fn`` on leaf copies of ``inputs`` and return the gradients of ``(out * upstream).sum()``.

    Args:
        not_finite: The likely cause of a NaN or inf gradient, for the message.

    Raises:
        CheckError: If the output is detached from the inputs, or a gradient is missing, NaN or inf.
    """
    __tracebackhide__ = True  # noqa: F841
    leaves = tuple(x.clone().requires_grad_(True) for x in inputs)
    got = call(fn, *leaves, name=name, expected=f"{what} again, now for inputs that require a gradient",
               error_hint="it works on tensors that need no gradient and fails on ones that do: a detour through "
                          "NumPy (.numpy()) cuts the result off from autograd")
    out = got[0] if isinstance(got, tuple) and len(got) == 2 else got

    def listed(names: list[str]) -> str:
        return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)

    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        raise CheckError(_DETACHED.format(what=what, inputs=listed(list(input_names))))
    grads = torch.autograd.grad((out * upstream).sum(), leaves, allow_unused=True)
    missing = [leaf_name for leaf_name, grad in zip(input_names, grads) if grad is None]
    if missing:
        raise CheckError(_DETACHED.format(what=what, inputs=listed(missing)))
    for leaf_name, grad in zip(input_names, grads):
        if not torch.isfinite(grad).all():
            raise CheckError(f"{what} have the right values, but their gradient with respect to {leaf_name} is NaN "
                             f"or inf{not_finite or ''}: one training step with it would turn every weight of a "
                             "model into NaN")
    return grads


def check_attention_entropy(fn: Callable[[torch.Tensor], Any], seed: int = 0, B: int = 2, T: int = 3,
                            S: int = 5) -> None:
    """Check a learner's ``attention_entropy(weights) -> (B, T)`` in nats (notebook 04, exercise 1).

    The weights include one-hot rows and zeros (masked keys), where 0 · log 0
    must count as 0, in the forward pass and in the backward pass: the
    gradient with respect to the weights must be finite everywhere (a NaN at
    a masked key would spread through the softmax to every score).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(B, T, S, generator=g)
    mask = masks.padding_mask(torch.tensor([S] + [max(1, S - 2)] * (B - 1)), S)  # (B, 1, S): some keys masked
    weights = attention.masked_softmax(scores, mask)  # (B, T, S), zeros on masked keys
    weights[0, 0] = torch.nn.functional.one_hot(torch.tensor(1), S).float()  # a one-hot row: entropy 0
    weights_copy = weights.clone()
    got = call(fn, weights, name="attention_entropy", expected=f"entropies of shape (B, T) = {(B, T)}")
    if not torch.equal(weights, weights_copy):
        raise CheckError("attention_entropy changed `weights` in place: use out-of-place operations")
    expected = attention.attention_entropy(weights)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (B, T) and torch.isnan(got).any():
        raise CheckError("some entropies are NaN: a weight of exactly 0 (a masked key) gives 0 · log 0 = 0 · (-inf) "
                         "= NaN, a term the convention counts as 0")
    suspects = {
        "the minus sign is missing: an entropy is never negative": -expected,
        "this is in bits (a base-2 log): the course measures entropy in nats (the natural log)":
            expected / torch.log(torch.tensor(2.0)),
        "this is a mean over the keys: the entropy is a sum over them": expected / S,
    }
    hints = {
        (B, S): "you summed over the queries: the entropy of query i sums over its own keys",
        (B, T, S): "the terms are not yet summed over the keys",
        (): "a single number: return one entropy per query, (B, T)",
    }
    check_close(got, expected, name="entropies", shape="B T", dims={"B": B, "T": T}, hints=hints,
                suspects=suspects, hint="it is none of the usual mistakes: compare each term with the exercise's formula, and check "
                     "what the masked keys (weight 0) contribute")
    (grad,) = _gradients(fn, (weights,), torch.ones(B, T), name="attention_entropy", what="the entropies",
                         input_names=("the weights",),
                         not_finite=" at the weights that are exactly 0: the backward pass still goes through "
                                    "log 0 = -inf there (and 0 · -inf = NaN), even where the forward pass counted "
                                    "the term as 0. Through the softmax, a NaN at one masked key reaches every score")
    positive = weights > 0
    if not torch.allclose(grad[positive], -(weights[positive].log() + 1), atol=1e-4, rtol=1e-4):
        raise CheckError("the entropies have the right values, but not the right gradient with respect to the "
                         "weights that are not 0: is part of the computation detached or replaced by a constant?")
    passed("attention_entropy")


def check_scaled_scores(fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int = 0, B: int = 2, H: int = 4,
                        T: int = 3, S: int = 5, Dh: int = 6) -> None:
    """Check a learner's ``scaled_scores(q, k) -> (B, H, T, S)`` (notebook 04, exercise 2).

    Forward: the values, with the usual wrong scales recognised. Backward: the
    gradients with respect to q and k must exist, be finite and be right.

    Raises:
        CheckError: Naming the likely bug, in particular a scale by the model
            width D = H · Dh instead of the per-head key width Dh.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g)
    k = torch.randn(B, H, S, Dh, generator=g)
    copies = (q.clone(), k.clone())
    got = call(fn, q, k, name="scaled_scores", expected=f"scores of shape (B, H, T, S) = {(B, H, T, S)}")
    if not (torch.equal(q, copies[0]) and torch.equal(k, copies[1])):
        raise CheckError("scaled_scores changed q or k in place: use out-of-place operations")
    expected = attention.scaled_scores(q, k)
    raw = q @ k.transpose(-2, -1)
    D = H * Dh
    suspects = {
        "the scores were not scaled: with unit-variance components, a dot product's variance is the number of "
        "terms it sums, not 1": raw,
        f"the scores were scaled by the model width D = H · Dh = {D}, but each head's dot product sums over its own "
        f"Dh = {Dh} numbers only": raw / D**0.5,
        f"the scores were divided by Dh = {Dh}, not by its square root": raw / Dh,
        "the scores were multiplied by sqrt(Dh) instead of divided by it": raw * Dh**0.5,
        f"the scores were scaled by the number of heads, H = {H}: it does not enter a head's dot product": raw / H**0.5,
        f"the scores were scaled by the number of queries, T = {T}: it does not enter a dot product": raw / T**0.5,
    }
    hints = {
        (B, H, S, T): "keys by queries: did you compute k @ q^T? Queries index the rows of the scores",
        (B, H, T, Dh): "that is the shape of q: the dot product sums over Dh",
    }
    check_close(got, expected, name="scores", shape="B H T S", dims={"B": B, "H": H, "T": T, "S": S}, hints=hints,
                suspects=suspects, hint="it is none of the usual mistakes: check the product and the scale separately")
    upstream = torch.randn(B, H, T, S, generator=g)
    grad_q, grad_k = _gradients(fn, (q, k), upstream, name="scaled_scores", what="the scores",
                                input_names=("q", "k"))
    q_ref, k_ref = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    want_q, want_k = torch.autograd.grad((attention.scaled_scores(q_ref, k_ref) * upstream).sum(), (q_ref, k_ref))
    for leaf_name, grad, want in (("q", grad_q, want_q), ("k", grad_k, want_k)):
        if not torch.allclose(grad, want, atol=1e-5, rtol=1e-4):
            raise CheckError(f"the scores have the right values, but not the right gradient with respect to "
                             f"{leaf_name}: is part of the computation detached or replaced by a constant?")
    passed("scaled_scores")


def check_attention_scale(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any], seed: int = 0, B: int = 2,
                          H: int = 3, T: int = 4, S: int = 5, Dk: int = 16, Dv: int = 7) -> None:
    """Check that attention code ``fn(q, k, v) -> out`` (or ``(out, weights)``) scales the scores by 1/sqrt(Dk).

    Notebook 04, common pitfalls: attention written around a library call can
    end up with another effective scale (scaled twice, ``scale=`` given the
    divisor, the scale applied after the softmax), or with a softmax that
    overflows. Two calls: ordinary inputs (q, k, v of shapes (B, H, T, Dk),
    (B, H, S, Dk), (B, H, S, Dv)), where each of those mistakes gives a
    different output; then queries and keys ten times larger, so that even the
    scaled scores reach about 100, where exp overflows in float32. Then a
    backward pass on the ordinary inputs: finite gradients for q, k and v.

    Raises:
        CheckError: Naming the effective scale, or the overflow.
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dk, generator=g)
    k = torch.randn(B, H, S, Dk, generator=g)
    v = torch.randn(B, H, S, Dv, generator=g)
    dims = {"B": B, "H": H, "T": T, "Dv": Dv}
    for label, factor in (("", 1.0), (" for large scores (queries and keys 10 times larger)", 10.0)):
        qs, ks = factor * q, factor * k
        got = call(fn, qs, ks, v, name="attention", expected=f"out of shape (B, H, T, Dv) = {(B, H, T, Dv)}")
        out = got[0] if isinstance(got, tuple) and len(got) == 2 else got
        expected, _ = attention.scaled_dot_product_attention(qs, ks, v)
        if (factor > 1 and isinstance(out, torch.Tensor) and tuple(out.shape) == (B, H, T, Dv)
                and not torch.isfinite(out).all()):
            raise CheckError(
                f"out is NaN or inf{label}: exp overflows float32 for scores above about 88, even after the "
                "1/sqrt(Dk) scale. Subtract each row's largest score before exp (torch.softmax does), "
                "which leaves the weights unchanged")
        raw = qs @ ks.transpose(-2, -1)  # (B, H, T, Dk) @ (B, H, Dk, S) -> (B, H, T, S)

        def out_with(scores: torch.Tensor) -> torch.Tensor:
            return torch.softmax(scores, dim=-1) @ v  # (B, H, T, S) @ (B, H, S, Dv) -> (B, H, T, Dv)

        suspects = {
            "the scores were not scaled: multiply them by 1/sqrt(Dk)": out_with(raw),
            f"the scores were divided by Dk = {Dk} in all, not by sqrt(Dk): were they scaled twice, e.g. q divided "
            "by sqrt(Dk) and then passed to a function that scales by 1/sqrt(Dk) again? (μP divides by Dk on "
            "purpose, with its own initialisation and learning rates; this attention is meant to use 1/sqrt(Dk))":
                out_with(raw / Dk),
            f"the scores were multiplied by sqrt(Dk) = {Dk**0.5:g}: `scale=` (in F.scaled_dot_product_attention and "
            "in the course's attention) is the factor that multiplies the scores, so pass 1/sqrt(Dk) or leave it None":
                out_with(raw * Dk**0.5),
            f"the scores were scaled by the model width, 1/sqrt(H · Dk) = 1/sqrt({H * Dk}): each head's dot product "
            f"sums over Dk = {Dk} numbers": out_with(raw / (H * Dk) ** 0.5),
            "the scale was applied after the softmax, to the weights or to out (both give this out): the softmax "
            "is then as saturated as with no scale at all, and out is sqrt(Dk) times too small (divided weights "
            "also no longer sum to 1). The scale belongs on the scores, before the softmax":
                out_with(raw) / Dk**0.5,
            "the scale was applied after the softmax as well as before it: out is sqrt(Dk) times too small":
                expected / Dk**0.5,
        }
        check_close(out, expected, name=f"out{label}", shape="B H T Dv", dims=dims, suspects=suspects,
                    hint="it is none of the usual wrong scales: check the softmax's dimension and what enters it")
    _gradients(fn, (q, k, v), torch.randn(B, H, T, Dv, generator=g), name="attention", what="the outputs",
               input_names=("q", "k", "v"))
    passed("attention scale")
