"""Checkers for notebook 08: the gradient that reaches each block of a stack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import transformer
from course_utils.checks.core import call, describe, passed, reference_guard
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


def _stack_gradients(seed: int, N: int, D: int, unused: bool, without: tuple[int, ...] = (),
                     absent: tuple[int, ...] = ()) -> dict[str, torch.Tensor | None]:
    """The gradients of a random stack of N encoder blocks, named as nn.ModuleList names them; ``unused``: some
    gradients None; ``without``: the blocks whose gradients are all None (a block the loss does not depend on);
    ``absent``: the blocks with no entry in the dict at all."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stack = torch.nn.ModuleList(transformer.TransformerEncoderBlock(D, 2, 2 * D, norm_first=bool(k % 2))
                                    for k in range(N))
        x, weights = torch.randn(2, 5, D), torch.randn(2, 5, D)
        h = x
        for block in stack:
            h = block(h)
        names, params = zip(*stack.named_parameters())
        grads = dict(zip(names, torch.autograd.grad((h * weights).sum(), params)))
    if unused:  # parameters the loss does not depend on: no gradient at all
        for name in list(grads)[:: max(1, len(grads) // 3)]:
            grads[name] = None
    for name in grads:
        if int(name.split(".")[0]) in without:
            grads[name] = None
    return {name: g for name, g in grads.items() if int(name.split(".")[0]) not in absent}


def _gradient_suspects(grads: dict[str, torch.Tensor | None], N: int) -> dict[str, list[float]]:
    def norms(block_of: Callable[[str], list[int]], reduce: str = "norm",
              keep: Callable[[str, torch.Tensor], bool] = lambda name, g: True) -> list[float]:
        totals = [0.0] * N
        for name, g in grads.items():
            if g is None or not keep(name, g):
                continue
            for k in block_of(name):
                totals[k] += float(g.norm()) if reduce == "sum of norms" else float((g ** 2).sum())
        return totals if reduce in ("squared", "sum of norms") else [t ** 0.5 for t in totals]

    exact = lambda name: [int(name.split(".")[0])]  # noqa: E731
    prefix = lambda name: [k for k in range(N) if name.startswith(str(k))]  # noqa: E731
    right = norms(exact)
    return {
        "a parameter was given to every block whose index its name starts with: '10.self_attn...' starts with '1' "
        "as well as '10'. Take the whole number before the first dot": norms(prefix),
        "the norms of a block's parameters were added up; the norm of a block's gradient is the square root of the "
        "sum of the squares of all its entries, over all its parameters": norms(exact, "sum of norms"),
        "the square root is missing: that is the squared norm": norms(exact, "squared"),
        "the blocks come out in the reverse order: the first value belongs to block 0, nearest the input": right[::-1],
        "only the weight matrices were counted; the biases and the LayerNorms' gains and shifts are parameters too":
            norms(exact, keep=lambda name, g: g.dim() >= 2),
        "only the weights were counted: every parameter whose name ends in .bias was left out":
            norms(exact, keep=lambda name, g: not name.endswith(".bias")),
        f"{_SKIPPED} the norms of the blocks that have one moved up to the first places": (
            [v for v in right if v > 0] + [0.0] * sum(v == 0 for v in right)),
    }


_SKIPPED = "a block without a gradient (every gradient of its parameters None) lost its place in the list:"
_PLACES = ("a block without a gradient (every gradient of its parameters None, or no entry in grads at all) still "
           "has its place in the list, with the norm 0. The list has num_layers entries, block k at index k, whichever blocks appear with a "
           "gradient in grads")


@exercise_check
def check_gradient_norm_per_block(fn: Callable[..., Any], seed: int = 0, N: int = 12, D: int = 8) -> None:
    """Check ``gradient_norm_per_block(grads, num_layers) -> list of N floats`` (notebook 08, exercise).

    ``grads`` holds the gradients of a random stack of N encoder blocks, named as
    ``nn.ModuleList(blocks).named_parameters()`` names them (``"11.self_attn.q_proj.weight"``);
    with N >= 11 a name's prefix is ambiguous. Then the same with some gradients None,
    then with N = 4 in which blocks 1 and 3 have no gradient at all (every gradient of
    theirs None: their norms are 0, at their places, and the list still has num_layers
    entries, the last block's included), with N = 3 in which block 1 has no entry in ``grads``
    at all (its norm is 0, at its place: the list is built from num_layers, not from the names
    present), and with N = 1.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    from course_utils.experiments import deep_stacks

    cases = [(f"a stack of {N} blocks", N, False, (), ()),
             (f"a stack of {N} blocks, some gradients None", N, True, (), ()),
             ("a stack of 4 blocks in which blocks 1 and 3 have no gradient (all their gradients None)", 4, False,
              (1, 3), ()),
             ("a stack of 3 blocks in which block 1 has no entry in grads at all", 3, False, (), (1,)),
             ("a stack of 1 block", 1, False, (), ())]
    with reference_guard(fn, deep_stacks.gradient_norm_per_block):
        for description, n, unused, without, absent in cases:
            grads = _stack_gradients(seed, n, D, unused, without, absent)
            without = without + absent  # blocks whose norm is 0
            copies = {name: None if g is None else g.clone() for name, g in grads.items()}
            expected = deep_stacks.gradient_norm_per_block(grads, n)
            got = call(fn, grads, n, name="gradient_norm_per_block", expected=f"a list of {n} floats, one per block",
                       error_hint="some gradients may be None (the loss does not depend on that parameter): they "
                                  "add nothing")
            if any((g is None) != (copies[name] is None) or (g is not None and not torch.equal(g, copies[name]))
                   for name, g in grads.items()):
                raise CheckError("gradient_norm_per_block changed a gradient in place: it only measures")
            if isinstance(got, torch.Tensor) and got.dim() == 1:
                got = got.tolist()
            if without and isinstance(got, (list, tuple)) and len(got) != n:
                raise CheckError(f"for {description}, gradient_norm_per_block returned {len(got)} values for "
                                 f"num_layers = {n}: {_PLACES}")
            if not isinstance(got, (list, tuple)) or len(got) != n:
                raise CheckError(f"for {description}, gradient_norm_per_block returned {describe(got)}: expected a "
                                 f"list of {n} floats, one per block")
            try:
                values = [float(v) for v in got]
            except (TypeError, ValueError, RuntimeError):
                raise CheckError(f"for {description}, gradient_norm_per_block returned {describe(got)}: each entry "
                                 "must be a number (a float, or a tensor with one element)") from None

            def close(a: list[float], b: list[float]) -> bool:
                return all(abs(u - v) <= 1e-4 * max(1.0, abs(v)) + 1e-6 for u, v in zip(a, b))

            if close(values, expected):
                continue
            for mistake, variant in _gradient_suspects(grads, n).items():
                if close(values, variant) and not close(variant, expected):
                    raise CheckError(f"for {description}: {mistake}")
            if without and not close([values[k] for k in without], [0.0] * len(without)):
                raise CheckError(f"for {description}, the blocks without a gradient did not get 0: {_PLACES}")
            worst = max(range(n), key=lambda k: abs(values[k] - expected[k]))
            raise CheckError(f"for {description}, block {worst} got {values[worst]:.4g}, not its gradient norm: "
                             "collect the squares of every gradient that belongs to the block, then take the root")
    passed("gradient_norm_per_block")
