"""Checkers for notebook 05: splitting and merging heads, multi-head attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from course_utils.blocks import attention, masks, multihead
from course_utils.checks.core import (call, check_close, check_gradients, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.checks.inspection import course_function, torch_call_count
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


@exercise_check
def check_split_heads(fn: Callable[[torch.Tensor, int], Any], seed: int = 0, B: int = 2, T: int = 3, H: int = 4,
                      Dh: int = 5) -> None:
    """Check a learner's ``split_heads(x, num_heads) -> (B, H, T, Dh)`` (notebook 05, exercise 1).

    Forward and backward, at the sizes asked for, then at B = 1, T = 1, H = 1 and
    sizes that all differ. Then how it is written: the exercise asks for the split
    "without a loop over the heads", so the tensor operations it makes are counted
    for H = 2 and H = 5 heads of the same width (:func:`_split_without_a_loop`).

    Raises:
        CheckError: Naming the likely bug, in particular a ``view`` straight to
            the head shape, which scrambles tokens across heads, and heads cut
            out one at a time.
    """
    __tracebackhide__ = True  # noqa: F841
    _check_heads(fn, multihead.split_heads, _split_heads_once, seed, {"B": B, "T": T, "H": H, "Dh": Dh},
                 written=_split_without_a_loop)


def _check_heads(fn: Callable[..., Any], reference: Callable[..., Any], once: Callable[..., None], seed: int,
                 dims: dict[str, int], written: Callable[[Callable[..., Any], int], None] | None = None) -> None:
    """Run ``once(fn, seed, **sizes)`` at the sizes asked for, then with B, T and H each set to 1, then at sizes
    that all differ; then ``written(fn, seed)``, if given (how the function is written); ``fn`` must not be or call
    ``reference``."""
    __tracebackhide__ = True  # noqa: F841
    distinct = {"B": 2, "T": 3, "H": 4, "Dh": 5}
    with reference_guard(fn, reference):
        sweep(lambda **sizes: once(fn, seed, **sizes),
              shape_cases(dims, ones=tuple(letter for letter in dims if letter != "Dh"),
                          distinct={letter: distinct[letter] for letter in dims}))
        if written is not None:
            written(fn, seed)
    passed(reference.__name__)


class _TensorOps(TorchFunctionMode):
    """Counts the torch functions and tensor methods called while it is active (``x.shape`` and ``x[...]`` too)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


# Operations that make one tensor per head, or join per-head tensors: the heads are handled one at a time.
_PER_HEAD = frozenset({"stack", "cat", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack",
                       "row_stack", "chunk", "split", "tensor_split", "unbind", "split_with_sizes", "unsafe_chunk",
                       "unsafe_split", "hsplit", "vsplit", "dsplit"})
_NO_LOOP = ("The exercise asks for the split without a loop over the heads: all H heads at once, by giving the "
            "numbers a new shape and a new order of axes (section 2), whatever the number of heads")


def _split_without_a_loop(fn: Callable[..., Any], seed: int) -> None:
    """Reject a ``split_heads`` that handles the heads one at a time (the values were right).

    Its tensor operations are counted for H = 2 and for H = 5 heads of the same width: a
    split without a loop over the heads makes the same operations whatever H is, and none
    that cuts a tensor into pieces or joins pieces (``torch.stack``, ``torch.cat``,
    ``chunk``, ``split``, ``unbind``). A view, ``reshape``, ``unflatten``, ``transpose``,
    ``permute``, ``movedim`` or ``contiguous`` passes, in any combination. Nothing is
    counted for the course's own functions (the out-of-kernel grader's proxy, whose
    operations run in another process).
    """
    __tracebackhide__ = True  # noqa: F841
    if course_function(fn):
        return
    g = torch.Generator().manual_seed(seed)
    counts = {}
    for H in (2, 5):
        x = torch.randn(2, 3, H * 3, generator=g)  # (B, T, D) with Dh = 3
        with _TensorOps() as ops:
            call(fn, x, H, name="split_heads", expected=f"a (B, H, T, Dh) = {(2, H, 3, 3)} tensor")
        joined = sorted(_PER_HEAD.intersection(ops.names))
        if joined:
            raise CheckError(f"the heads are right, but split_heads builds them one at a time: it cuts x into one "
                             f"piece per head, or joins per-head pieces ({', '.join(f'`{name}`' for name in joined)}), "
                             f"a loop over the heads even when one call hides it. {_NO_LOOP}")
        counts[H] = len(ops.names)
    if counts[5] != counts[2]:
        raise CheckError(f"the heads are right, but split_heads makes {counts[2]} tensor operations for H = 2 heads "
                         f"and {counts[5]} for H = 5 (indexing included): some are made once per head, a loop over "
                         f"the heads (a for loop, a comprehension or map). {_NO_LOOP}")


def _split_heads_once(fn: Callable[[torch.Tensor, int], Any], seed: int, B: int, T: int, H: int, Dh: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    D = H * Dh
    x = torch.randn(B, T, D, generator=g)
    x_copy = x.clone()
    got = call(fn, x, H, name="split_heads", expected=f"a (B, H, T, Dh) = {(B, H, T, Dh)} tensor",
               error_hint="if the error says a shape is invalid: the sizes you ask for must multiply to B * T * D, "
                          "with D = H * Dh. If it is about a view and strides: a view cannot reorder memory, and once "
                          "an axis has moved the numbers are no longer stored in order")
    if not torch.equal(x, x_copy):
        raise CheckError("split_heads changed x in place: view and transpose return new tensors")
    expected = multihead.split_heads(x, H)
    suspects = {
        "the view went straight to (B, H, T, Dh): that cuts x's memory into blocks of T * Dh numbers, so one "
        "'head' holds features of several tokens. Each token's features must stay with their token "
        "(section 2)": x.reshape(B, H, T, Dh),
        "head h takes every H-th feature (h, h + H, ...): head h must take the contiguous block of features "
        "h * Dh ... (h + 1) * Dh - 1": x.view(B, T, Dh, H).permute(0, 3, 1, 2),
    }
    hints = {
        (B * H, T, Dh): "keep B and H as two dimensions, (B, H, T, Dh); and remember that a view "
                        "straight to the head shape mixes tokens (section 2)",
        (B, T, H, Dh): "the features are cut into heads, but the head axis is still after the token axis: "
                       "the result must be (B, H, T, Dh), heads before tokens",
        (T, B * H, Dh): "a view to (T, B * H, Dh) of a (B, T, D) tensor reinterprets memory and mixes batch "
                        "elements and positions; the result must be (B, H, T, Dh)",
    }
    check_close(got, expected, name="the heads", shape="B H T Dh", dims={"B": B, "H": H, "T": T, "Dh": Dh},
                hints=hints, suspects=suspects, hint="head h of token i must be x[b, i, h*Dh:(h+1)*Dh]")
    check_gradients(fn, (x, H), multihead.split_heads, name="split_heads", wrt={0: "x"}, what="the heads", seed=seed)


@exercise_check
def check_merge_heads(fn: Callable[[torch.Tensor], Any], seed: int = 0, B: int = 2, H: int = 4, T: int = 3,
                      Dh: int = 5) -> None:
    """Check a learner's ``merge_heads(x) -> (B, T, H * Dh)`` (notebook 05, exercise 2).

    Forward and backward, at the sizes asked for, then at B = 1, H = 1, T = 1 and
    sizes that all differ.

    Raises:
        CheckError: Naming the likely bug, in particular a reshape without the transpose back.
    """
    __tracebackhide__ = True  # noqa: F841
    _check_heads(fn, multihead.merge_heads, _merge_heads_once, seed, {"B": B, "H": H, "T": T, "Dh": Dh})


def _merge_heads_once(fn: Callable[[torch.Tensor], Any], seed: int, B: int, H: int, T: int, Dh: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, T, Dh, generator=g)
    x_copy = x.clone()
    got = call(fn, x, name="merge_heads", expected=f"a (B, T, D) = {(B, T, H * Dh)} tensor",
               error_hint="if the error is about a view and strides: once the head axis has moved, the numbers "
                          "are no longer stored in (B, T, D) order, and a view cannot reorder memory (an operation "
                          "that copies when it must can)")
    if not torch.equal(x, x_copy):
        raise CheckError("merge_heads changed x in place: use out-of-place operations")
    expected = multihead.merge_heads(x)
    suspects = {
        "the heads were reshaped to (B, T, D) without transposing back first: memory holds head 0's tokens, "
        "then head 1's, so each 'token' of the result mixes several tokens": x.reshape(B, T, H * Dh),
        "the features are interleaved (head index last): feature f of token i must come from head f // Dh, "
        "as whole blocks of Dh features": x.permute(0, 2, 3, 1).reshape(B, T, H * Dh),
    }
    hints = {
        (B, T, H, Dh): "the heads are transposed back but not concatenated: each token needs its H blocks of "
                       "Dh features side by side, (B, T, H * Dh)",
        (B * H, T, Dh): "merge means concatenating the H heads of each token: (B, T, H * Dh)",
    }
    check_close(got, expected, name="the merged heads", shape="B T D", dims={"B": B, "T": T, "D": H * Dh},
                hints=hints, suspects=suspects, hint="out[b, i, h*Dh:(h+1)*Dh] must be x[b, h, i]")
    check_gradients(fn, (x,), multihead.merge_heads, name="merge_heads", wrt={0: "x"}, what="the merged heads",
                    seed=seed)


def _mha_variant(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, projections: tuple[Any, ...],
                 H: int, mask: torch.Tensor | None, *, bad_split: bool = False, bad_merge: bool = False,
                 scale_by_model_width: bool = False, no_scale: bool = False,
                 no_out_proj: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention with one chosen mistake (for the checker's suspects)."""
    q_proj, k_proj, v_proj, out_proj = projections
    B, T, D = query.shape
    Dh = D // H

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(B, H, x.shape[1], Dh) if bad_split else multihead.split_heads(x, H)

    q, k, v = split(q_proj(query)), split(k_proj(key)), split(v_proj(value))
    scale = 1.0 if no_scale else D**-0.5 if scale_by_model_width else None
    context, weights = attention.scaled_dot_product_attention(q, k, v, mask, scale)
    merged = context.reshape(B, T, D) if (bad_merge or bad_split) else multihead.merge_heads(context)
    return (merged if no_out_proj else out_proj(merged)), weights


_SDPA_RULED_OUT = ("the values are right, but your function calls scaled_dot_product_attention (the course's, or "
                   "PyTorch's F.scaled_dot_product_attention), which the exercise rules out: the batched steps are "
                   "yours to write. Compute the scores as one batched product, divide them as each head of the loop "
                   "does, and normalise them with masked_softmax")
_LENGTHS = ("key and value may be longer than query (S != T): take their length from their own shape, not from "
            "query's; the mask may have any shape that broadcasts to (B, H, T, S)")


def _runs(attempt: Callable[[], Any]) -> bool:
    """Whether a call of the learner's function returns without a ``CheckError``."""
    try:
        attempt()
    except CheckError:
        return False
    return True


@exercise_check
def check_multi_head_attention(fn: Callable[..., Any], seed: int = 0, B: int = 2, T: int = 3, S: int = 4,
                               D: int = 12, H: int = 3) -> None:
    """Check a learner's ``multi_head_attention(query, key, value, q_proj, k_proj, v_proj, out_proj, num_heads, mask)``.

    Notebook 05, exercise 3. Calls: self-attention without a mask (query, key
    and value the same tensor, as the text allows); cross-attention (S != T)
    with three different tensors and a padding mask of shape (B, 1, 1, S); the
    other mask shapes the text allows ((T, S), (B, 1, T, S), (B, H, T, S)); a
    backward pass. At the sizes asked for, then at B = 1, H = 1 and sizes that
    all differ. ``split_heads`` and ``merge_heads`` of the course may be used; the
    exercise asks for the scores and their scale to be written out, with
    ``masked_softmax``, so a call of ``scaled_dot_product_attention`` (the course's
    or PyTorch's ``F.scaled_dot_product_attention``, also through
    ``nn.MultiheadAttention``) is rejected, at any depth (the reference guard's
    profile hook).

    Raises:
        CheckError: Naming the likely bug: the wrong split, a merge without
            the transpose, a scale by sqrt(D) instead of sqrt(Dh) or no scale, a missing
            output projection, averaged weights, key used as value, a head
            axis added to a mask that has one (recognised by running once
            more with the mask's head axis taken away).
    """
    __tracebackhide__ = True  # noqa: F841
    ruled_out = dict.fromkeys((attention.scaled_dot_product_attention, F.scaled_dot_product_attention), _SDPA_RULED_OUT)
    with reference_guard(fn, multihead.multi_head_attention, multihead.MultiHeadAttention.forward, ruled_out=ruled_out):
        sweep(lambda B, T, S, D, H: _mha_once(fn, seed, B, T, S, D, H),
              shape_cases({"B": B, "T": T, "S": S, "D": D, "H": H}, ones=("B", "H"),
                          distinct={"B": 2, "T": 3, "S": 4, "D": 12, "H": 3}))
        _no_loop_over_heads(fn, seed)
    passed("multi_head_attention")


def _no_loop_over_heads(fn: Callable[..., Any], seed: int) -> None:
    """The same inputs with 1 head and with 6: as many torch calls both times, or the function loops over heads."""
    __tracebackhide__ = True  # noqa: F841
    counts = []
    for H in (1, 6):
        torch.manual_seed(seed)
        projections = [torch.nn.Linear(12, 12) for _ in range(4)]
        x = torch.randn(2, 3, 12, generator=torch.Generator().manual_seed(seed))
        _, count = torch_call_count(fn, x, x, x, *projections, H, name="multi_head_attention",
                                    expected="(out, weights)")
        counts.append(count)
    if None not in counts and counts[1] > counts[0]:
        raise CheckError(f"the outputs are right, but your function makes more torch calls with 6 heads than with 1 "
                         f"({counts[1]} against {counts[0]}): it loops over the heads, which the exercise rules out "
                         "(\"no loop over heads\"). After the split every head is one slice of the head axis, and "
                         "one product serves them all")


def _mha_once(fn: Callable[..., Any], seed: int, B: int, T: int, S: int, D: int, H: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the learner's global random state is left alone
        torch.manual_seed(seed)
        projections = tuple(torch.nn.Linear(D, D) for _ in range(4))
    x = torch.randn(B, T, D, generator=g)
    memory = torch.randn(B, S, D, generator=g)
    lengths = torch.full((B,), S)
    lengths[-1] = S - 1
    pad = masks.padding_mask(lengths, S)[:, None]  # (B, 1, 1, S)
    value = torch.randn(B, S, D, generator=g)  # a third tensor: key and value are not always the same
    per_query = torch.rand(B, 1, T, S, generator=g) < 0.6
    per_head = torch.rand(B, H, T, S, generator=g) < 0.6
    per_query[..., 0] = per_head[..., 0] = True  # every query may attend to key 0
    Dh = D // H
    mask_cases = [(f"cross-attention with a ({', '.join(letters)}) = {tuple(m.shape)} mask", m)
                  for letters, m in ((("T", "S"), masks.causal_mask(T, S)), (("B", "1", "T", "S"), per_query),
                                     (("B", "H", "T", "S"), per_head))]
    for label, (query, key, value_, mask) in [("self-attention", (x, x, x, None)),
                                              ("cross-attention with a padding mask", (x, memory, value, pad))] + [
            (label, (x, memory, value, m)) for label, m in mask_cases]:
        Tq, Sk = query.shape[1], key.shape[1]

        def run(mask_: torch.Tensor | None, error_hint: str = _LENGTHS) -> Any:
            return call(fn, query, key, value_, *projections, H, mask_, name="multi_head_attention",
                        expected=f"a tuple (out (B, T, D) = {(B, Tq, D)}, weights (B, H, T, S) = {(B, H, Tq, Sk)})",
                        error_hint=error_hint)

        with torch.no_grad():
            try:
                got = run(mask)
            except CheckError:
                if mask is not None and mask.dim() == 4 and mask.shape[1] == 1 and _runs(lambda: run(mask[:, 0])):
                    run(mask, f"it runs when the mask's head axis is taken away: the mask handed in, "
                              f"{tuple(mask.shape)}, already has its head axis and broadcasts to the (B, H, T, S) "
                              "scores as it is; one more axis makes the scores 5-D")  # the same error, its cause
                raise
            expected_out, expected_weights = multihead.multi_head_attention(query, key, value_, *projections, H, mask)
            variants = {
                "the heads were split with a view straight to (B, H, T, Dh), which scrambles tokens across heads "
                "(section 2)": _mha_variant(query, key, value_, projections, H, mask, bad_split=True),
                "the heads were merged with a reshape to (B, T, D) without transposing back, which mixes tokens "
                "(Exercise 2)": _mha_variant(query, key, value_, projections, H, mask, bad_merge=True),
                f"the scores were scaled by sqrt(D) = sqrt({D}), the model width; each head's queries and keys have "
                f"Dk = Dh = {Dh} features: divide by sqrt(Dk)": _mha_variant(query, key, value_, projections, H, mask,
                                                                      scale_by_model_width=True),
                "the scores were not scaled at all: notebook 04's scale belongs in every head too (which width is "
                "Dk for one head?)": _mha_variant(query, key, value_, projections, H, mask, no_scale=True),
                "the output projection is missing: apply out_proj to the merged heads": _mha_variant(
                    query, key, value_, projections, H, mask, no_out_proj=True),
                "the mask was ignored: padded keys get weight": _mha_variant(query, key, value_, projections, H, None),
            }
            if mask is not None:
                variants["the mask was inverted: keys marked True got no weight and the others all of it. In this "
                         "course (and in F.scaled_dot_product_attention) True means may attend; ~mask is "
                         "nn.MultiheadAttention's convention, where True means ignore"] = _mha_variant(
                    query, key, value_, projections, H, ~mask)
            if value_ is not key:
                variants["the values were computed from key: v_proj must be applied to value (key and value are "
                         "often, but not always, the same tensor)"] = _mha_variant(query, key, key, projections, H,
                                                                                    mask)
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckError(f"{label}: expected a tuple (out, weights), got {describe(got)}")
        out, weights = got
        if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, Tq, Sk):
            raise CheckError(f"{label}: the weights are averaged over the heads, (B, T, S); return one pattern per "
                             "head, (B, H, T, S) (nn.MultiheadAttention averages them unless average_attn_weights=False)")
        check_close(weights, expected_weights, name=f"weights ({label})", shape="B H T S",
                    dims={"B": B, "H": H, "T": Tq, "S": Sk}, suspects={m: w for m, (_, w) in variants.items()},
                    hints={(B, 1, Tq, Sk): "only one head: split the projections into H heads of width Dh = D // H"},
                    hint="head h's weights are softmax(q k^T / sqrt(Dk)) over the allowed keys, with that head's q and k "
                         "and Dk = Dh")
        check_close(out, expected_out, name=f"out ({label})", shape="B T D", dims={"B": B, "T": Tq, "D": D},
                    suspects={m: o for m, (o, _) in variants.items()},
                    hints={(B, H, Tq, Dh): "the heads are not merged: out must be (B, T, D), the heads of each "
                                           "token side by side and then mixed by the output projection"},
                    hint="each head's output is the weighted sum of its values; the heads of each token are "
                         "concatenated, then mixed by the output projection (section 3's equations)")
    check_gradients(fn, (x, memory, value, *projections, H, pad), multihead.multi_head_attention,
                    name="multi_head_attention", wrt={0: "query", 1: "key", 2: "value"}, what="out and the weights",
                    seed=seed)
