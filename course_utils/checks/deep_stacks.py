"""Checkers for notebook 08: one Adam update, written from scratch and compared with torch.optim.Adam."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import adam as torch_adam

from course_utils.checks.core import call, check_close, check_tensor, describe, passed, reference_guard
from course_utils.checks.flow import exercise_check
from course_utils.core.errors import CheckError


@dataclass(frozen=True)
class _Case:
    """A run of several Adam steps on one tensor, with its own settings."""

    label: str
    lr: float
    betas: tuple[float, float] | None  # None: call without betas and eps, the defaults (0.9, 0.999) and 1e-8
    eps: float
    scale: float  # the typical size of a gradient entry
    dtype: torch.dtype = torch.float64
    steps: int = 6


_DEFAULTS = ((0.9, 0.999), 1e-8)
_CASES = (
    _Case("gradients of size about 1, the default betas and eps, lr = 1e-3", 1e-3, None, 1e-8, 1.0),
    _Case("large gradients, of size about 1000, lr = 3e-2", 3e-2, (0.9, 0.999), 1e-8, 1e3),
    _Case("tiny gradients, of size about 1e-9, smaller than eps = 1e-8", 1e-3, (0.9, 0.999), 1e-8, 1e-9),
    _Case("beta1 = 0, so that m_t is the latest gradient alone", 1e-2, (0.0, 0.999), 1e-8, 1.0),
    _Case("betas = (0.5, 0.9), eps = 1e-3, lr = 0.1, gradients of size about 0.01", 0.1, (0.5, 0.9), 1e-3, 1e-2),
    _Case("float32 tensors", 1e-2, (0.9, 0.999), 1e-8, 1.0, torch.float32, 3),
)


def _corrected(m: torch.Tensor, v: torch.Tensor, t: int, beta1: float,
               beta2: float) -> tuple[torch.Tensor, torch.Tensor]:
    return m / (1 - beta1 ** t), v / (1 - beta2 ** t)


def _m_suspects(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, b1: float, b2: float,
                given: bool) -> dict[str, torch.Tensor]:
    new = b1 * m + (1 - b1) * g
    found = {
        "m came back as it went in: it must become the running average with g_t in it": m,
        "m's two weights are swapped: the old average must keep the larger share, beta1, and g_t get 1 - beta1": (
            (1 - b1) * m + b1 * g),
        "m was averaged with beta2, v's decay rate: m's is beta1": b2 * m + (1 - b2) * g,
        "m averages the squares of the gradients: m averages g_t itself, v its square": b1 * m + (1 - b1) * g ** 2,
        "the m returned is the bias-corrected one: return m_t itself, which the next step goes on averaging "
        "(the correction is only for the step)": new / (1 - b1 ** t),
    }
    if given and (b1, b2) != _DEFAULTS[0]:
        found["adam_step ignored the betas it was given and used the default ones: use its betas argument"] = (
            0.9 * m + 0.1 * g)
    return found


def _v_suspects(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, b1: float, b2: float,
                given: bool) -> dict[str, torch.Tensor]:
    new = b2 * v + (1 - b2) * g ** 2
    found = {
        "v averages g_t instead of its square g_t ** 2 (so v can be negative, and its square root NaN)":
            b2 * v + (1 - b2) * g,
        "v averages |g_t| instead of the square g_t ** 2": b2 * v + (1 - b2) * g.abs(),
        "v came back as it went in: it must become the running average with g_t ** 2 in it": v,
        "v's two weights are swapped: the old average must keep the larger share, beta2, and g_t ** 2 get 1 - beta2": (
            (1 - b2) * v + b2 * g ** 2),
        "v was averaged with beta1, m's decay rate: v's is beta2": b1 * v + (1 - b1) * g ** 2,
        "v averages the square of the new m, not of the gradient g_t": b2 * v + (1 - b2) * (b1 * m + (1 - b1) * g) ** 2,
        "the v returned is the bias-corrected one: return v_t itself, which the next step goes on averaging "
        "(the correction is only for the step)": new / (1 - b2 ** t),
    }
    if given and (b1, b2) != _DEFAULTS[0]:
        found["adam_step ignored the betas it was given and used the default ones: use its betas argument"] = (
            0.999 * v + 0.001 * g ** 2)
    return found


def _step_suspects(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, lr: float, b1: float,
                   b2: float, eps: float, given: bool) -> dict[str, torch.Tensor]:
    """What each known mistake changes a parameter by, from the right m_{t-1} and v_{t-1}."""
    m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g ** 2
    m_hat, v_hat = _corrected(m1, v1, t, b1, b2)
    found: dict[str, torch.Tensor] = {}
    if lr != 1e-3:
        found["adam_step ignored the learning rate it was given and stepped with 1e-3: use its lr argument"] = (
            -1e-3 * m_hat / (v_hat.sqrt() + eps))
    if given and eps != _DEFAULTS[1]:
        found["adam_step ignored the eps it was given and used 1e-8: use its eps argument"] = (
            -lr * m_hat / (v_hat.sqrt() + 1e-8))
    if given and (b1, b2) != _DEFAULTS[0]:
        d1, d2 = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g ** 2
        found["adam_step ignored the betas it was given and used the default ones: use its betas argument"] = (
            -lr * (d1 / (1 - 0.9 ** t)) / ((d2 / (1 - 0.999 ** t)).sqrt() + eps))
    found |= {
        "the bias correction is missing: m and v start at 0, so in the first steps they are far smaller than the "
        "gradients they average. Work out by how much for a gradient that stays the same, and divide that out": (
            -lr * m1 / (v1.sqrt() + eps)),
        "only m is bias-corrected; v starts at 0 as well and needs its own correction, with beta2": (
            -lr * m_hat / (v1.sqrt() + eps)),
        "only v is bias-corrected; m starts at 0 as well and needs its own correction, with beta1": (
            -lr * (m1 / (v_hat.sqrt() + eps))),
        "eps was added inside the square root; this exercise adds it after the square root of the corrected v, as "
        "PyTorch does (with gradients smaller than eps the two differ by orders of magnitude)": (
            -lr * m_hat / (v_hat + eps).sqrt()),
        "eps is missing from the denominator": -lr * m_hat / v_hat.sqrt(),
        "eps was added to the square root of v before v's correction (the reordering at the end of Kingma and Ba's "
        "section 2, whose epsilon is another constant); this exercise adds eps to the square root of the corrected v, "
        "as PyTorch does": -lr * ((1 - b2 ** t) ** 0.5 / (1 - b1 ** t)) * m1 / (v1.sqrt() + eps),
        "the parameters moved up the gradient: the step must be subtracted": lr * m_hat / (v_hat.sqrt() + eps),
        "the step divides by the corrected v itself, not by its square root": -lr * m_hat / (v_hat + eps),
        "the step was taken with m and v as they came in (m_{t-1} and v_{t-1}), before g_t was averaged in": (
            -lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)),
        "the step uses g_t where it should use the corrected average m": -lr * g / (v_hat.sqrt() + eps),
        "the bias corrections use t + 1: t is the number of this step, counted from 1, and used as it is": (
            -lr * (m1 / (1 - b1 ** (t + 1))) / ((v1 / (1 - b2 ** (t + 1))).sqrt() + eps)),
        "the bias corrections ignore t and always correct as for step 1: they depend on the step's number t": (
            -lr * (m1 / (1 - b1)) / ((v1 / (1 - b2)).sqrt() + eps)),
    }
    if t > 1:
        found["the bias corrections use t - 1: t is the number of this step, counted from 1, and used as it is"] = (
            -lr * (m1 / (1 - b1 ** (t - 1))) / ((v1 / (1 - b2 ** (t - 1))).sqrt() + eps))
    return found


@exercise_check
def check_adam_step(fn: Callable[..., Any], seed: int = 0, shape: tuple[int, ...] = (3, 4)) -> None:
    """Check a learner's ``adam_step(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8)`` (notebook 08).

    Each case runs several steps of ``torch.optim.Adam`` on a tensor of ``shape``, with a new random gradient
    at every step, and calls the learner's function at each step t = 1, 2, ... with the optimizer's own
    parameters, m_{t-1} and v_{t-1} and that gradient, so that a mistake is found at the step it first shows.
    The cases: gradients of size 1 with the default betas and eps (called without them), large gradients, tiny
    gradients below eps (where eps's place decides the step), beta1 = 0, other betas, eps and lr (an answer that
    ignores an argument), and float32 tensors (the dtype is kept). The inputs must come back unchanged.
    ``torch.optim.Adam`` (its functional ``torch.optim.adam.adam``) is ruled out by the exercise text.

    Raises:
        CheckError: Naming the likely bug, never the expected values.
    """
    __tracebackhide__ = True  # noqa: F841
    from course_utils.experiments import deep_stacks

    ruled_out = ("the exercise rules out torch.optim.Adam: write the step yourself from the description in "
                 "section 4")
    letters = " ".join(f"d{i}" for i in range(len(shape)))
    dims = {f"d{i}": n for i, n in enumerate(shape)}
    with reference_guard(fn, deep_stacks.adam_step, ruled_out={torch_adam.adam: ruled_out}):
        for number, case in enumerate(_CASES):
            g = torch.Generator().manual_seed(1000 * seed + number)
            start = torch.randn(shape, generator=g, dtype=case.dtype)
            theirs = torch.nn.Parameter(start.clone())
            betas, eps = case.betas or _DEFAULTS[0], case.eps
            optimizer = torch.optim.Adam([theirs], lr=case.lr, betas=betas, eps=eps, foreach=False)
            m, v = torch.zeros_like(start), torch.zeros_like(start)
            b1, b2 = betas
            tight = case.dtype == torch.float64
            for t in range(1, case.steps + 1):
                grad = case.scale * torch.randn(shape, generator=g, dtype=case.dtype)
                param = theirs.detach().clone()
                where = f"at step t = {t} of a run with {case.label}, on a tensor of shape {tuple(shape)}"
                inputs = {"param": param, "grad": grad, "m": m, "v": v}
                copies = {name: x.clone() for name, x in inputs.items()}
                args = (param, grad, m, v, t, case.lr) + (() if case.betas is None else (betas, eps))
                got = call(fn, *args, name="adam_step",
                           expected="a tuple of three tensors: the new parameters, m and v")
                for name, x in inputs.items():
                    if not torch.equal(x, copies[name]):
                        raise CheckError(f"adam_step changed its argument {name} in place ({where}): return new "
                                         "tensors and leave the arguments as they came")
                if not isinstance(got, (tuple, list)) or len(got) != 3:
                    raise CheckError(f"adam_step returned {describe(got)} {where}: expected a tuple of three tensors, "
                                     "the new parameters, m_t and v_t")
                new_param, new_m, new_v = got
                theirs.grad = grad.clone()
                optimizer.step()
                state = optimizer.state[theirs]
                want_m, want_v = state["exp_avg"].detach().clone(), state["exp_avg_sq"].detach().clone()
                given = case.betas is not None
                atol, rtol = (1e-12, 1e-9) if tight else (1e-6, 1e-4)
                check_close(new_m, want_m, name=f"m {where}", shape=letters, dims=dims,
                            suspects=_m_suspects(param, grad, m, v, t, b1, b2, given), atol=atol * case.scale,
                            rtol=rtol, hint="m_t is the running average of the gradients, with decay rate beta1")
                check_close(new_v, want_v, name=f"v {where}", shape=letters, dims=dims,
                            suspects=_v_suspects(param, grad, m, v, t, b1, b2, given),
                            atol=atol * case.scale ** 2, rtol=rtol,
                            hint="v_t is the running average of the squared gradients, with decay rate beta2")
                new_param = check_tensor(new_param, name=f"the new parameters {where}", shape=letters, dims=dims,
                                         dtype=case.dtype, allow_nan=True)
                change = new_param - param
                if t == 1 and not torch.isfinite(change).all():
                    raise CheckError(f"the step is NaN or infinite {where}: something was divided by zero at the "
                                     "first step. t is the number of this step, counted from 1")
                want = theirs.detach() - param
                check_close(change, want, name=f"the change of the parameters (new minus old) {where}",
                            shape=letters, dims=dims,
                            suspects=_step_suspects(param, grad, m, v, t, case.lr, b1, b2, eps, given),
                            atol=(1e-9 if tight else 1e-4) * case.lr, rtol=1e-6 if tight else 1e-3,
                            hint="with m_t and v_t right, look at the step: the two bias corrections, where eps goes, "
                                 "the learning rate and the sign")
                m, v = want_m, want_v  # the next step starts from the right state
    passed("adam_step")
