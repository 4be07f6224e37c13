"""Checkers for notebook 03: scaled dot-product attention, the worked example."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, masks
from course_utils.checks.core import (call, check_close, check_gradients, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.core.errors import CheckError, ExerciseOpen
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


# The "spot the error" exercise of notebook 03: statements about a worked example
# (3 tokens, D = 4 features, Dk = Dv = 3), some right and some wrong.
WORKED_EXAMPLE_STATEMENTS: dict[int, str] = {
    1: "W_Q has shape 3 × 4: one row for each of the 3 query features.",
    2: "q_0 = x_0 W_Q is a vector of 3 numbers.",
    3: "There is one score e_ij for each pair of a query i and a key j, so the scores form a 3 × 3 matrix.",
    4: "The weight of key j for query i is w_ij = 1 / (1 + exp(-s)), with s its scaled score, so every weight lies "
       "between 0 and 1.",
    5: "The scores e_ij = q_i · k_j are divided by √4 = 2 before the softmax, because each token has D = 4 "
       "features.",
    6: "The output for token i is z_i = Σ_j w_ij v_i.",
    7: "Each row of the 3 × 3 weight matrix sums to 1.",
    8: "Without a mask, the output z_0 depends on all three tokens.",
}
# No answer key is stored here, in any form a learner's kernel could import and read: the checker knows the right
# set only by a salted SHA-256 of its canonical form (its numbers, sorted, joined by commas), and the explanation of
# every statement is stored encrypted with a key derived the same way from the right set. A learner's set that is
# right opens the explanation; any other set opens nothing. (Eight statements make 256 sets, which a loop over the
# checker can try: a search the checker cannot prevent, but no key to read.)
_SALT = b"attention course, notebook 03, spot the error: "
_WRONG_COUNT = 4  # how many statements are wrong: the exercise says so
_RIGHT_SET_SHA256 = "97face0361e8a92c27487a4958627e91c477bbba8e0db6c9744379843be4dc9c"
_EXPLANATION = (  # "N. right|wrong: why." for N = 1..8, XOR a SHA-256 keystream of the right set, base64
    "TZNqwSdTCljVzhZzqHE6wXhG971Nt3Ka+epNqaoJL9sHL04RIUU6C1k5Q5YiYI2qSRTszYYowpXkHFR4g8B7sx8XF49gK5AljDV5"
    "RRf2455EBOmuum37receF3hJ8c53sgRuN5NVXa8reWkk5U7cTkTBV595HuFgL19k+/fahkajGjeZacRBcXFfY55ljg0aruZosecM"
    "HozHaapwllOezGupvO5A26aJyVcDl2bPHEaAxVBxcDCYvExgFswVGcW9N2U0loZpTHNUbBv/4Sdja2P+bPw0ykZw6AtNyF/h46mT"
    "/kjvkr2fA75OUoBxPziXiuunn69PmdmQFrXm/98IyoJ/HQDnFqjVlKH8JPLLO0j3PA7/nZFuBHiJlVK18uvKbrZWspjTH7ENx+Nl"
    "2sfwJ/vJJpeuugT5U9IA9m8CKllz9vGJOfczQ9w1o++RMtoj8hiSg7ZR2ksW3vpR9VdLdoooAlIFbXbJrMEVG/HixEq7BZ24j5No"
    "RiKDzLqnrciYXR3Cg9QfKoHQxlybaQa6lKl12XonQPUpogospy7zA+fg6k2KvmlKBD0xzYJw9j/y+8kGJ/G1LCmUvdZ5zBOp48aL"
    "tSQgNr9WObc3hSUU98V0trd1PoS/7TYt1ke26qdFZAN1sKCQjsLffcomYqUYeEy+DddVFQl4cPrHElibcu+/5geDaJ/UnkCYKWzp"
    "5EvcoWSPlZwidsyGrDbf6Mp62aRjKJNBW/9+CeaVvwQIlGAGOFqK+5oEXzCmGSRG0ZkeQiLxV0nRQ5r10KhhVKUaQ5Cr9Wy5Xxom"
    "omUgIIgy0OGu6/IUImb1Zkg3jwK0J87qb3NRX/rsLy5hyWnSHoDjTlc72q5Blcs1aLXLpc6zSdFcYfCLtNtEHg=="
)


def _canonical(numbers: set[int]) -> bytes:
    return ",".join(str(n) for n in sorted(numbers)).encode()


def _is_right(numbers: set[int]) -> bool:
    return hashlib.sha256(_SALT + b"check " + _canonical(numbers)).hexdigest() == _RIGHT_SET_SHA256


def _explanation(numbers: set[int]) -> str:
    """The explanation of every statement, opened with the right set (call it only once ``_is_right(numbers)``)."""
    key = hashlib.sha256(_SALT + b"key " + _canonical(numbers)).digest()
    data = base64.b64decode(_EXPLANATION)
    stream = b"".join(hashlib.sha256(key + i.to_bytes(4, "big")).digest() for i in range(len(data) // 32 + 1))
    return bytes(a ^ b for a, b in zip(data, stream)).decode()


@exercise_check
def check_spot_the_error(answer: Any) -> None:
    """Check the set of wrong statement numbers of notebook 03's "spot the error" exercise.

    The set is judged as a whole. A wrong set is told only how its size compares
    with the number of wrong statements (which the exercise states), never how
    many or which of its numbers are right: so no sequence of tries, one-element
    sets included, learns more than "exactly right or not" about any statement.
    The right set is told why each statement is right or wrong: the explanation
    opens with that set (see ``_EXPLANATION``); nothing importable holds the key.

    Raises:
        CheckError: Saying that the set is not yet right, and how its size compares.
    """
    __tracebackhide__ = True  # noqa: F841
    if answer is None:
        raise CheckError("expected a set of statement numbers, e.g. {2, 3}, got None: assign the set to `spot_the_error`")
    if isinstance(answer, (int, str)) or not hasattr(answer, "__iter__"):
        raise CheckError(f"expected a set of statement numbers, e.g. {{2, 3}}, got {describe(answer)}")
    items = list(answer)
    if not items:  # the release's starting value: nothing picked yet
        raise ExerciseOpen("spot_the_error is still empty: assign it the set of the numbers of the wrong "
                           "statements, as the exercise shows")
    numbers = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item not in WORKED_EXAMPLE_STATEMENTS:
            raise CheckError(f"{item!r} is not a statement number: use the integers 1 to "
                             f"{len(WORKED_EXAMPLE_STATEMENTS)}")
        numbers.add(item)
    if not _is_right(numbers):
        n, wrong = len(numbers), _WRONG_COUNT
        if n < wrong:
            size = (f"your set has {n} number{'' if n == 1 else 's'} and {wrong} statements are wrong, so at least "
                    f"{wrong - n} wrong statement{'' if wrong - n == 1 else 's'} {'is' if wrong - n == 1 else 'are'} "
                    "still missing from it")
        elif n > wrong:
            size = (f"your set has {n} numbers and only {wrong} statements are wrong, so at least {n - wrong} of "
                    f"your numbers {'is a right statement' if n - wrong == 1 else 'are right statements'}")
        else:
            size = (f"your set has the right size, {wrong}, but at least one of its numbers is a right statement "
                    "and one wrong statement is missing")
        raise CheckError(f"not yet the set of wrong statements: {size}. The check judges the set as a whole and never "
                         "says which numbers are off. Test each statement against section 7's worked example again")
    passed("spot the error")
    cell = _cell()
    if cell is None or cell != _EXPLAINED_IN.get("cell"):  # once per notebook cell (the hidden tests check twice)
        _EXPLAINED_IN["cell"] = cell
        print("What is right or wrong in each statement, and why:\n" + _explanation(numbers))


_EXPLAINED_IN: dict[str, int | None] = {}


def _cell() -> int | None:
    """The execution count of the notebook cell that runs now, or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return None if shell is None else shell.execution_count
