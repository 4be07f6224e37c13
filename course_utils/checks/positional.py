"""Checkers for notebook 06: sinusoidal encodings, rotary embeddings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import positional
from course_utils.checks.core import call, check_close, check_gradients, passed, reference_guard, shape_cases, sweep
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


@exercise_check
def check_sinusoidal_positional_encoding(fn: Callable[[int, int], Any], T: int = 12, D: int = 8) -> None:
    """Check a learner's ``sinusoidal_positional_encoding(T, D) -> (T, D)`` (notebook 06 gives it; for a lecturer who sets it as an exercise).

    At the sizes asked for, then at T = 1, D = 2 and sizes with T != D.

    Raises:
        CheckError: Naming the likely bug (sin and cos swapped, one frequency
            per feature instead of per pair, the halves layout, positions from 1).
    """
    __tracebackhide__ = True  # noqa: F841
    cases = shape_cases({"T": T, "D": D}, ones=("T",), distinct={"T": 12, "D": 8})
    if D != 2:
        cases.insert(1, ("D = 2 (one pair of features)", {"T": T, "D": 2},
                         "with a single pair there is one frequency, theta_0 = 1: check how the frequencies are "
                         "indexed"))
    with reference_guard(fn, positional.sinusoidal_positional_encoding):
        sweep(lambda T, D: _sinusoidal_once(fn, T, D), cases)
    passed("sinusoidal_positional_encoding")


def _sinusoidal_once(fn: Callable[[int, int], Any], T: int, D: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    got = call(fn, T, D, name="sinusoidal_positional_encoding", expected=f"a (T, D) = {(T, D)} float tensor")
    expected = positional.sinusoidal_positional_encoding(T, D)
    p = torch.arange(T, dtype=torch.float32)[:, None]  # (T, 1)
    theta = positional.frequencies(D)  # (D/2,)
    per_feature = 10000.0 ** (-torch.arange(D, dtype=torch.float32) / D)  # (D,): a frequency per feature

    def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a, b], dim=-1).reshape(a.shape[0], -1)  # (T, D/2) x2 -> (T, D)

    suspects = {
        "sin and cos are swapped: even features (2f) take the sine, odd features (2f + 1) the cosine":
            interleave(torch.cos(p * theta), torch.sin(p * theta)),
        "each feature got its own frequency 10000^(-j/D); the two features of a pair (2f, 2f + 1) share "
        "theta_f = 10000^(-2f/D)": torch.where(torch.arange(D) % 2 == 0, torch.sin(p * per_feature),
                                               torch.cos(p * per_feature)),
        "this is the 'halves' layout (all sines, then all cosines), used by some libraries; the paper puts the sine "
        "of pair f in feature 2f and its cosine in feature 2f + 1":
            torch.cat([torch.sin(p * theta), torch.cos(p * theta)], -1),
        "positions start at 1: the first token has position 0":
            interleave(torch.sin((p + 1) * theta), torch.cos((p + 1) * theta)),
        "the angle is p * 10000^(+2f/D): the exponent's sign is flipped, so the last pairs turn fastest":
            interleave(torch.sin(p / theta), torch.cos(p / theta)),
    }
    hints = {(D, T): "rows are positions and columns features: (T, D)", (T, D // 2): "only D/2 columns: write the sines "
             "into the even columns and the cosines into the odd ones"}
    check_close(got, expected, name="the encoding", shape="T D", dims={"T": T, "D": D}, hints=hints, suspects=suspects,
                hint="PE[p, 2f] = sin(p / 10000^(2f/D)) and PE[p, 2f + 1] = cos(p / 10000^(2f/D))")


@exercise_check
def check_apply_rotary(fn: Callable[[torch.Tensor, torch.Tensor | None], Any], seed: int = 0, B: int = 2, T: int = 5,
                       Dk: int = 8) -> None:
    """Check a learner's ``apply_rotary(x, positions=None)`` on x of shape (B, T, Dk) (notebook 06, exercise 1).

    Default and given positions, a bfloat16 x at positions from 1000, and a
    backward pass; at the sizes asked for, at B = 1, T = 1 and sizes that all
    differ, and on (B, H, T, Dk) and (T, Dk) inputs (the text allows any
    leading axes).

    Raises:
        CheckError: Naming the likely bug (rotation the wrong way, the rotate-half
            pairing, ignored positions, angles rounded to bfloat16).
    """
    __tracebackhide__ = True  # noqa: F841
    leading = "the code assumes 3-D x: the pairs are in the last axis and the positions in the one before it, " \
              "whatever the number of leading axes"
    cases = shape_cases({"B": B, "T": T, "Dk": Dk}, ones=("B", "T"), distinct={"B": 2, "T": 5, "Dk": 8})
    cases += [(f"(B, H, T, Dk) = {(B, 3, T, Dk)} x, with a head axis", {"B": B, "T": T, "Dk": Dk, "H": 3}, leading),
              (f"(T, Dk) = {(T, Dk)} x, without a batch axis", {"B": None, "T": T, "Dk": Dk}, leading)]
    with reference_guard(fn, positional.apply_rotary):
        sweep(lambda B, T, Dk, H=None: _apply_rotary_once(fn, seed, tuple(n for n in (B, H) if n is not None), T, Dk),
              cases)
    passed("apply_rotary")


def _apply_rotary_once(fn: Callable[[torch.Tensor, torch.Tensor | None], Any], seed: int, lead: tuple[int, ...],
                       T: int, Dk: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    letters = ("B", "H")[:len(lead)]
    shape, dims = " ".join(letters + ("T", "Dk")), {**dict(zip(letters, lead)), "T": T, "Dk": Dk}
    x = torch.randn(*lead, T, Dk, generator=g)
    positions = torch.tensor([3, 0, 7, 1, 12][:T] + list(range(20, 20 + max(0, T - 5))))
    x_copy = x.clone()
    for label, args in [("default positions", (x, None)), ("given positions", (x, positions))]:
        got = call(fn, *args, name="apply_rotary", expected=f"a tensor shaped like x, {tuple(x.shape)}")
        if not torch.equal(x, x_copy):
            raise CheckError("apply_rotary changed x in place: build the output in a new tensor")
        pos = torch.arange(T) if args[1] is None else args[1]
        expected = positional.apply_rotary(x, args[1])
        angles = pos[:, None].float() * positional.frequencies(Dk)[None, :]  # (T, Dk/2)
        half = Dk // 2
        first, second = x[..., :half], x[..., half:]
        halves = torch.cat([first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()], -1)
        suspects = {
            "each pair is turned the wrong way, by the angle -p theta_f instead of +p theta_f":
                positional.apply_rotary(x, -pos),
            "this pairs feature f with feature f + Dk/2 (the 'rotate half' layout of GPT-NeoX and Hugging Face's "
            "LLaMA): the same rotation up to a permutation of the features, but this exercise asks for the paper's "
            "adjacent pairs (2f, 2f + 1)": halves,
            "the positions were ignored: every row came out as if it sat at position 0":
                positional.apply_rotary(x, torch.zeros_like(pos)),
        }
        if args[1] is not None:
            suspects["the given positions were ignored: use 0 .. T - 1 only when positions is None"] = (
                positional.apply_rotary(x, None))
        check_close(got, expected, name=f"the rotated x ({label})", shape=shape, dims=dims,
                    suspects=suspects, hint="pair (2f, 2f + 1) of the row at position p is turned by the angle "
                                            "p * theta_f, theta_f = 10000^(-2f/Dk)")
    # bfloat16 at large positions: the angles must not be rounded to x's dtype before cos and sin
    x16 = torch.randn(*lead, T, Dk, generator=g).to(torch.bfloat16)
    far = 1000 + torch.arange(T)  # bfloat16 rounds 1001 and 1002 to 1000
    got = call(fn, x16, far, name="apply_rotary", expected=f"a bfloat16 tensor shaped like x, {tuple(x16.shape)}")
    even, odd = x16[..., 0::2], x16[..., 1::2]

    def turned(angles: torch.Tensor) -> torch.Tensor:  # (T, Dk/2) bfloat16 angles -> (..., T, Dk)
        return torch.stack([even * angles.cos() - odd * angles.sin(), even * angles.sin() + odd * angles.cos()],
                           dim=-1).flatten(-2)

    theta = positional.frequencies(Dk)  # (Dk/2,)
    rounded = "the angles were rounded to bfloat16 (x's dtype) before cos and sin"
    check_close(got, positional.apply_rotary(x16, far), name="the rotated bfloat16 x (positions 1000, 1001, ...)",
                shape=shape, dims=dims, atol=0.05, rtol=0.02,
                suspects={  # the first message is true of both variants (they often give the same values)
                    f"{rounded}: bfloat16 keeps 8 significant bits, so an angle near 1000 radians can be off by "
                    "2 radians, and positions 1000, 1001 and 1002 get the same angle in pair 0":
                        turned(far[:, None].to(torch.bfloat16) * theta.to(torch.bfloat16)[None, :]),
                    f"{rounded}, after being computed in float32: bfloat16 keeps 8 significant bits, so an angle near "
                    "1000 radians can be off by 2 radians": turned((far[:, None].float() * theta[None, :]).bfloat16()),
                },
                hint="look at how precisely the angles of positions near 1000 are computed")
    check_gradients(fn, (x, positions), positional.apply_rotary, name="apply_rotary", wrt={0: "x"},
                    what="the rotated rows", seed=seed)


@exercise_check
def check_to_rotate_half(fn: Callable[[torch.Tensor, int], Any], seed: int = 0, H: int = 2, Dh: int = 8,
                         D_in: int = 12) -> None:
    """Check a learner's ``to_rotate_half(weight, num_heads)`` (notebook 06, exercise 2).

    On the (D, D_in) weight and the (D,) bias of a query projection with H heads of
    Dh features (D = H * Dh); then with one head, with one pair per head, and with
    D_in = D. It then checks what the conversion is for: rotate-half attention with
    the converted weights computes the scores that the paper's layout computed.

    Raises:
        CheckError: Naming the likely bug (a reordering across heads instead of
            within each, the inverse reordering, columns instead of rows, nothing reordered).
    """
    __tracebackhide__ = True  # noqa: F841
    cases = [(f"H = {H}, Dh = {Dh}, D_in = {D_in}", {"H": H, "Dh": Dh, "D_in": D_in}, ""),
             ("one head, H = 1", {"H": 1, "Dh": Dh, "D_in": D_in},
              "with one head the reordering covers all the rows: check how the heads are laid out"),
             ("one pair per head, Dh = 2", {"H": 3, "Dh": 2, "D_in": D_in},
              "with one pair per head nothing moves: the result must equal the input"),
             (f"a square weight, D_in = D = {H * Dh}", {"H": H, "Dh": Dh, "D_in": H * Dh},
              "with D_in = D rows and columns have the same length: reorder the rows, the output features")]
    with reference_guard(fn, positional.to_rotate_half):
        sweep(lambda H, Dh, D_in: _to_rotate_half_once(fn, seed, H, Dh, D_in), cases)
    passed("to_rotate_half")


def _to_rotate_half_once(fn: Callable[[torch.Tensor, int], Any], seed: int, H: int, Dh: int, D_in: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    D = H * Dh
    weight, bias = torch.randn(D, D_in, generator=g), torch.randn(D, generator=g)
    perm = torch.cat([torch.arange(0, Dh, 2), torch.arange(1, Dh, 2)])  # (Dh,)
    within = (torch.arange(H)[:, None] * Dh + perm[None, :]).reshape(-1)  # (D,)
    inverse = (torch.arange(H)[:, None] * Dh + perm.argsort()[None, :]).reshape(-1)  # (D,)
    across = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # (D,): one reordering of all D rows
    for label, tensor in (("weight", weight), ("bias", bias)):
        copy = tensor.clone()
        got = call(fn, tensor, H, name="to_rotate_half",
                   expected=f"a tensor shaped like the {label}, {tuple(tensor.shape)}")
        if not torch.equal(tensor, copy):
            raise CheckError("to_rotate_half changed its input in place: return a new tensor")
        suspects = {
            "nothing was reordered": tensor,
            "these are the rows reordered the other way, from rotate-half back to the paper's pairs: the row that "
            "goes to rotate-half slot n is the paper's feature that slot n must hold, not the slot that feature n goes to": tensor[inverse],
        }
        if H > 1:
            suspects["the rows were reordered across the whole width D, as if it were one head: pairs (2f, 2f + 1) "
                     "live inside each head's Dh features, and each head is reordered on its own"] = tensor[across]
        if tensor.dim() == 2 and D_in == D:
            suspects["the columns were reordered: the rows of an nn.Linear weight are its output features, the "
                     "queries or keys that get rotated"] = tensor[:, within]
        check_close(got, tensor[within], name=f"the converted {label} (H = {H}, Dh = {Dh})", suspects=suspects,
                    hint="within each head, rotate-half slot f must hold the first member of the paper's pair f, and "
                         "slot f + Dh/2 its second member (section 3 prints both layouts' pairs)")
    # what it is for: the same scores from the rotate-half code
    x = torch.randn(1, 5, D_in, generator=g)  # (B, T, D_in)

    def heads(y: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, Dh)
        return y.view(1, 5, H, Dh).transpose(1, 2)

    k_weight = torch.randn(D, D_in, generator=g)
    interleaved = positional.apply_rotary(heads(x @ weight.T)) @ positional.apply_rotary(heads(x @ k_weight.T)).mT
    q_new, k_new = call(fn, weight, H, name="to_rotate_half"), call(fn, k_weight, H, name="to_rotate_half")
    converted = positional.apply_rotary_half(heads(x @ q_new.T)) @ positional.apply_rotary_half(heads(x @ k_new.T)).mT
    check_close(converted, interleaved, name="the scores of rotate-half attention with the converted weights",
                hint="convert the query and the key projection in the same way")
