"""Checkers for notebook 06: sinusoidal encodings, rotary embeddings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import positional
from course_utils.checks.core import call, check_close, passed
from course_utils.core.errors import CheckError


def check_sinusoidal_positional_encoding(fn: Callable[[int, int], Any], T: int = 12, D: int = 8) -> None:
    """Check a learner's ``sinusoidal_positional_encoding(T, D) -> (T, D)`` (notebook 06, exercise 1).

    Raises:
        CheckError: Naming the likely bug (sin and cos swapped, one frequency
            per feature instead of per pair, the halves layout, positions from 1).
    """
    __tracebackhide__ = True  # noqa: F841
    got = call(fn, T, D, name="sinusoidal_positional_encoding", expected=f"a (T, D) = {(T, D)} float tensor")
    expected = positional.sinusoidal_positional_encoding(T, D)
    p = torch.arange(T, dtype=torch.float32)[:, None]  # (T, 1)
    theta = positional.frequencies(D)  # (D/2,)
    per_feature = 10000.0 ** (-torch.arange(D, dtype=torch.float32) / D)  # (D,): a frequency per feature

    def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a, b], dim=-1).reshape(a.shape[0], -1)  # (T, D/2) x2 -> (T, D)

    suspects = {
        "sin and cos are swapped: even features (2m) take the sine, odd features (2m + 1) the cosine":
            interleave(torch.cos(p * theta), torch.sin(p * theta)),
        "each feature got its own frequency 10000^(-j/D); the two features of a pair (2m, 2m + 1) share "
        "theta_m = 10000^(-2m/D)": torch.where(torch.arange(D) % 2 == 0, torch.sin(p * per_feature),
                                               torch.cos(p * per_feature)),
        "this is the 'halves' layout (all sines, then all cosines), used by some libraries; the paper, and this "
        "course, interleave them: PE[:, 0::2] = sin, PE[:, 1::2] = cos":
            torch.cat([torch.sin(p * theta), torch.cos(p * theta)], -1),
        "positions start at 1: the first token has position 0":
            interleave(torch.sin((p + 1) * theta), torch.cos((p + 1) * theta)),
        "the angle is p * 10000^(2m/D) (the exponent's sign is flipped): divide p by 10000^(2m/D)":
            interleave(torch.sin(p / theta), torch.cos(p / theta)),
    }
    hints = {(D, T): "rows are positions and columns features: (T, D)", (T, D // 2): "only D/2 columns: write the sines "
             "into the even columns and the cosines into the odd ones"}
    check_close(got, expected, name="the encoding", shape="T D", dims={"T": T, "D": D}, hints=hints, suspects=suspects,
                hint="PE[p, 2m] = sin(p / 10000^(2m/D)) and PE[p, 2m + 1] = cos(p / 10000^(2m/D))")
    passed("sinusoidal_positional_encoding")


def check_apply_rotary(fn: Callable[[torch.Tensor, torch.Tensor | None], Any], seed: int = 0, B: int = 2, T: int = 5,
                       D: int = 8) -> None:
    """Check a learner's ``apply_rotary(x, positions=None)`` (notebook 06, exercise 2).

    Raises:
        CheckError: Naming the likely bug (rotation the wrong way, the rotate-half
            pairing, ignored positions, angles computed in bfloat16).
    """
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g)
    positions = torch.tensor([3, 0, 7, 1, 12][:T] + list(range(20, 20 + max(0, T - 5))))
    x_copy = x.clone()
    for label, args in [("default positions", (x, None)), ("given positions", (x, positions))]:
        got = call(fn, *args, name="apply_rotary", expected=f"a tensor shaped like x, {(B, T, D)}")
        if not torch.equal(x, x_copy):
            raise CheckError("apply_rotary changed x in place: build the output in a new tensor")
        pos = torch.arange(T) if args[1] is None else args[1]
        expected = positional.apply_rotary(x, args[1])
        angles = pos[:, None].float() * positional.frequencies(D)[None, :]  # (T, D/2)
        half = D // 2
        first, second = x[..., :half], x[..., half:]
        halves = torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)
        suspects = {
            "each pair is rotated the wrong way (by -p theta_m): x'_2m = x_2m cos - x_2m+1 sin, "
            "x'_2m+1 = x_2m sin + x_2m+1 cos": positional.apply_rotary(x, -pos),
            "this pairs feature m with feature m + D/2 (the 'rotate half' layout of GPT-NeoX and Hugging Face's LLaMA): "
            "the same rotation up to a permutation of the features, but this exercise asks for the paper's "
            "adjacent pairs (2m, 2m + 1)": halves,
            "the positions were ignored: rotate token t by its own position": positional.apply_rotary(x, torch.zeros_like(pos)),
        }
        if args[1] is not None:
            suspects["the given positions were ignored: use 0 .. T - 1 only when positions is None"] = (
                positional.apply_rotary(x, None))
        check_close(got, expected, name=f"the rotated x ({label})", shape="B T D", dims={"B": B, "T": T, "D": D},
                    suspects=suspects, hint="pair (2m, 2m + 1) of token t is rotated by the angle positions[t] * theta_m, "
                                            "theta_m = 10000^(-2m/D)")
    # bfloat16 at large positions: the angles must be computed in float32, not in x's dtype
    x16 = torch.randn(B, T, D, generator=g).to(torch.bfloat16)
    far = 1000 + torch.arange(T)  # bfloat16 rounds 1001 and 1002 to 1000
    got = call(fn, x16, far, name="apply_rotary", expected=f"a bfloat16 tensor shaped like x, {(B, T, D)}")
    angles16 = far[:, None].to(torch.bfloat16) * positional.frequencies(D).to(torch.bfloat16)[None, :]  # (T, D/2)
    even, odd = x16[..., 0::2], x16[..., 1::2]
    in_x_dtype = torch.stack([even * angles16.cos() - odd * angles16.sin(),
                              even * angles16.sin() + odd * angles16.cos()], dim=-1).flatten(-2)  # (B, T, D)
    check_close(got, positional.apply_rotary(x16, far), name="the rotated bfloat16 x (positions 1000, 1001, ...)",
                shape="B T D", dims={"B": B, "T": T, "D": D}, atol=0.05, rtol=0.02,
                suspects={"the angles were computed in x's dtype: bfloat16 keeps 8 significant bits, so positions "
                          "1000, 1001 and 1002 all become 1000. Compute positions * theta_m in float32, then cast cos "
                          "and sin to x's dtype": in_x_dtype},
                hint="compute the angles in float32 and return a tensor of x's dtype")
    passed("apply_rotary")
