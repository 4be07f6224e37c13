"""Checkers for notebook 09: one step of the online softmax, and causal attention in tiles."""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from course_utils.checks.core import (call, check_close, check_gradients, check_tensor, describe, passed,
                                     reference_guard, shape_cases, sweep)
from course_utils.core.errors import CheckError
from course_utils.experiments import efficiency
from course_utils.checks.flow import exercise_check


def _start(lead: tuple[int, ...], T: int, Dv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """m = -inf, l = 0, acc = 0: nothing folded in yet."""
    return torch.full((*lead, T, 1), float("-inf")), torch.zeros(*lead, T, 1), torch.zeros(*lead, T, Dv)


def _fold(update: Callable[..., Any], blocks: list[tuple[torch.Tensor, torch.Tensor]], lead: tuple[int, ...], T: int,
          Dv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, l, acc = _start(lead, T, Dv)
    for scores, v in blocks:
        m, l, acc = update(m, l, acc, scores, v)
    return m, l, acc


@exercise_check
def check_online_softmax_update(fn: Callable[..., Any], seed: int = 0, T: int = 3, Dv: int = 4,
                                block_sizes: tuple[int, ...] = (2, 3, 2)) -> None:
    """Check a learner's ``online_softmax_update(m, l, acc, scores, v) -> (m, l, acc)`` (notebook 09, exercise 1).

    Folds several blocks of keys (the second raises the running maximum, the
    third does not), then compares the final ``acc / l`` with softmax over all
    keys, and every intermediate state with the reference. Then a first block
    whose keys are all masked for one query, followed by an ordinary block and,
    separately, by a block of scores of about -200 (exp underflows to 0 unless
    that query's m stayed -inf), blocks of scores of about ±1e4
    (exp overflows without the running maximum) and a backward pass through the
    whole fold. At the sizes asked for, at T = 1, Dv = 1, and with a leading
    batch axis, (B, T, 1) and so on (the text allows any leading axes).

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    cases = shape_cases({"T": T, "Dv": Dv}, ones=("T", "Dv"))
    cases.append((f"a leading batch axis, m (B, T, 1) = {(2, T, 1)}", {"T": T, "Dv": Dv, "B": 2},
                  "the code assumes 2-D inputs: the keys are the last axis of scores, the queries the one before, "
                  "whatever the number of leading axes"))
    with reference_guard(fn, efficiency.online_softmax_update):
        sweep(lambda T, Dv, B=None: _online_once(fn, seed, () if B is None else (B,), T, Dv, block_sizes), cases)
    passed("online_softmax_update")


def _online_once(fn: Callable[..., Any], seed: int, lead: tuple[int, ...], T: int, Dv: int,
                 block_sizes: tuple[int, ...]) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    letters = ("B",)[:len(lead)]
    dims = {**dict(zip(letters, lead)), "T": T, "Dv": Dv, "1": 1}
    shape_1, shape_v = " ".join(letters + ("T", "1")), " ".join(letters + ("T", "Dv"))
    offsets = [0.0, 4.0, -3.0] + [0.0] * max(0, len(block_sizes) - 3)
    blocks = [(2.0 * torch.randn(*lead, T, n, generator=g) + offsets[i], torch.randn(*lead, n, Dv, generator=g))
              for i, n in enumerate(block_sizes)]
    all_scores = torch.cat([s for s, _ in blocks], dim=-1)  # (..., T, S)
    all_values = torch.cat([v for _, v in blocks], dim=-2)  # (..., S, Dv)
    expected_out = torch.softmax(all_scores, dim=-1) @ all_values  # (..., T, Dv)

    def no_acc_rescale(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l * torch.exp(m - m_new) + p.sum(-1, keepdim=True), acc + p @ v

    def no_rescale(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        return m_new, l + p.sum(-1, keepdim=True), acc + p @ v

    def inverted(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        c = torch.exp(m_new - m).nan_to_num(0.0, posinf=0.0)
        return m_new, l * c + p.sum(-1, keepdim=True), acc * c + p @ v

    suspects = {}
    for message, variant in [
        ("acc was not rescaled: when the maximum grows, multiply the old acc by exp(m_old - m_new), as for l",
         no_acc_rescale),
        ("the old sums were not rescaled: when a block raises the maximum, multiply l and acc by exp(m_old - m_new)",
         no_rescale),
        ("the correction is inverted: old sums are multiplied by exp(m_old - m_new) <= 1, not exp(m_new - m_old)",
         inverted),
    ]:
        _, l_v, acc_v = _fold(variant, blocks, lead, T, Dv)
        suspects[message] = acc_v / l_v

    state = _start(lead, T, Dv)
    states = []
    for i, (scores, v) in enumerate(blocks):
        inputs = (*state, scores, v)
        copies = tuple(t.clone() for t in inputs)
        got = call(fn, *inputs, name="online_softmax_update", expected="a tuple (m, l, acc)",
                   error_hint="m and l are (..., T, 1), acc is (..., T, D), scores (..., T, C) for a block of C keys, "
                              "v (..., C, D)")
        if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
            raise CheckError("online_softmax_update changed an input in place: return new tensors")
        if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
            raise CheckError(f"expected a tuple of three tensors (m, l, acc), got {describe(got)}")
        if i == 0 and not torch.isfinite(got[2]).all():
            raise CheckError("after the first block acc has NaN/inf: exp(scores - m) with the old maximum m = -inf is "
                             "inf. The new maximum has to be known before anything is exponentiated")
        states.append(got)
        state = got
    m, l, acc = state
    check_tensor(l, name="l after the last block", shape=shape_1, dims=dims)
    check_tensor(acc, name="acc after the last block", shape=shape_v, dims=dims)
    check_close(acc / l, expected_out, name="acc / l after the last block", shape=shape_v, dims=dims,
                suspects=suspects, hint="acc / l must equal softmax(all scores) @ all values")
    ref = _start(lead, T, Dv)
    for i, ((scores, v), got) in enumerate(zip(blocks, states)):
        ref = efficiency.online_softmax_update(*ref, scores, v)
        check_close(got[0], ref[0], name=f"m after block {i + 1}", shape=shape_1, dims=dims,
                    hint="m is the running maximum of every score seen so far: a block with smaller scores must not lower it")
        check_close(got[1], ref[1], name=f"l after block {i + 1}", shape=shape_1, dims=dims,
                    hint="l is the running sum of exp(score - running maximum): what was summed before must be rescaled to the new maximum")
        check_close(got[2], ref[2], name=f"acc after block {i + 1}", shape=shape_v, dims=dims,
                    hint="acc is the running sum of exp(score - running maximum) times the values, rescaled like l")
    # A first block whose keys are all masked for query 0 (its scores are -inf), then an ordinary block.
    masked_first = torch.randn(*lead, T, 2, generator=g)
    masked_first[..., 0, :] = float("-inf")
    later = 2.0 * torch.randn(*lead, T, 3, generator=g)
    values = (torch.randn(*lead, 2, Dv, generator=g), torch.randn(*lead, 3, Dv, generator=g))
    got = call(fn, *_start(lead, T, Dv), masked_first, values[0], name="online_softmax_update",
               expected="a tuple (m, l, acc)")
    if not (isinstance(got, tuple) and len(got) == 3) or not all(
            isinstance(t, torch.Tensor) and not torch.isnan(t).any() for t in got[1:]):
        raise CheckError(
            "a block whose scores are all -inf for one query (every key masked) gave NaN in l or acc: with m = -inf "
            "and m_new = -inf, exp(m - m_new) is exp(-inf + inf) = exp(nan). Such a row has summed nothing yet, so "
            "its l and acc must stay 0"
        )
    m, l, acc = call(fn, *got, later, values[1], name="online_softmax_update", expected="a tuple (m, l, acc)")
    all_scores = torch.cat([masked_first, later], dim=-1)  # (..., T, 5)
    expected_out = torch.softmax(all_scores, dim=-1) @ torch.cat(values, dim=-2)  # (..., T, Dv); row 0 uses `later` only
    check_close(acc / l, expected_out, name="acc / l after a fully masked first block", shape=shape_v, dims=dims,
                hint="a masked block must contribute nothing: the later blocks alone decide that query's output")
    # Scores of about ±1e4: only the running maximum keeps exp from overflowing float32 (above about 88).
    big = [(1e4 * torch.randn(*lead, T, n, generator=g), torch.randn(*lead, n, Dv, generator=g)) for n in block_sizes]
    _, l, acc = _fold(lambda *args: call(fn, *args, name="online_softmax_update", expected="a tuple (m, l, acc)"),
                      big, lead, T, Dv)
    big_out = torch.softmax(torch.cat([s for s, _ in big], dim=-1), dim=-1) @ torch.cat([v for _, v in big], dim=-2)
    if not (torch.isfinite(l).all() and torch.isfinite(acc).all()):
        raise CheckError("l or acc is NaN or inf for scores of about ±1e4: exp overflows float32 above about 88. "
                         "Every exponent must be taken relative to the running maximum, so that none is positive")
    check_close(acc / l, big_out, name="acc / l for scores of about ±1e4", shape=shape_v, dims=dims,
                hint="acc / l must equal softmax(all scores) @ all values, however large the scores")
    # The same masked block, then scores of about -200: exp(-200) underflows float32 to 0, so that query's m must
    # still be -inf (nothing seen yet), not the shift 0 used to exponentiate the masked block.
    far_below = -200.0 + torch.randn(*lead, T, 3, generator=torch.Generator().manual_seed(seed))  # g left as it was
    m, l, acc = call(fn, *got, far_below, values[1], name="online_softmax_update", expected="a tuple (m, l, acc)")
    expected_out = torch.softmax(torch.cat([masked_first, far_below], dim=-1), dim=-1) @ torch.cat(values, dim=-2)
    ok = (isinstance(l, torch.Tensor) and isinstance(acc, torch.Tensor) and l.shape == expected_out.shape[:-1] + (1,)
          and acc.shape == expected_out.shape and torch.allclose(acc / l, expected_out, atol=1e-5, rtol=1e-4))
    if (not ok and isinstance(got[0], torch.Tensor) and tuple(got[0].shape) == (*lead, T, 1)
            and torch.isfinite(got[0][..., 0, :]).all()):
        raise CheckError(
            "after a block whose scores are all -inf for one query, that query's m was finite (you returned "
            f"{got[0][(0,) * len(lead) + (0, 0)].item():g}), so the next block, with scores of about -200, was "
            "exponentiated relative to it: exp(-200) is 0 in float32, l stays 0 and acc / l is NaN or wrong. Such a "
            "query has seen no score yet, so its running maximum must stay -inf; the 0 used to exponentiate the "
            "masked block is only a shift for that step, not the new m"
        )
    check_close(acc / l, expected_out, name="acc / l after a fully masked block, then scores of about -200",
                shape=shape_v, dims=dims,
                hint="a masked block must contribute nothing, however small the later scores are")
    # Backward through the whole fold: acc / l must pass the same gradient to every score and value as the reference.
    flat = tuple(t for block in blocks for t in block)

    def folded(update: Callable[..., Any]) -> Callable[..., torch.Tensor]:
        def out(*tensors: torch.Tensor) -> torch.Tensor:
            _, l_, acc_ = _fold(update, list(zip(tensors[0::2], tensors[1::2])), lead, T, Dv)
            return acc_ / l_
        return out

    names = {i: f"the scores of block {i // 2 + 1}" if i % 2 == 0 else f"the values of block {i // 2 + 1}"
             for i in range(len(flat))}
    check_gradients(folded(fn), flat, folded(efficiency.online_softmax_update), name="online_softmax_update",
                    wrt=names, what="the outputs acc / l", seed=seed)


# --- exercise 2: causal attention in tiles, the tiles above the diagonal skipped ---------------------


# The functions that exponentiate or normalise scores: in tiled attention each one sees at most one tile's scores.
_EXPONENTIALS = frozenset({"exp", "exp_", "exp2", "exp2_", "special_exp2", "softmax", "_softmax", "special_softmax",
                           "log_softmax", "_log_softmax", "special_log_softmax", "logsumexp", "special_logsumexp"})


# Products that can compare queries with keys, and the operations whose result still holds the keys themselves
# (views, copies, scalings): a product taking such a tensor compares the queries with every key it holds.
_PRODUCTS = frozenset({"matmul", "__matmul__", "__rmatmul__", "bmm", "mm", "mv", "einsum", "baddbmm", "addmm",
                       "addbmm", "tensordot", "linear", "inner", "dot", "vdot"})
_KEEPS_KEYS = frozenset({"__getitem__", "narrow", "select", "index_select", "transpose", "swapaxes", "swapdims",
                         "permute", "t", "mT", "T", "view", "reshape", "flatten", "unsqueeze", "squeeze", "expand",
                         "expand_as", "broadcast_to", "contiguous", "clone", "to", "float", "double", "type",
                         "split", "chunk", "unbind", "tensor_split", "mul", "__mul__", "__rmul__", "div",
                         "__truediv__", "cat", "stack", "flip"})


# Of those, the elementwise products: a scaling when the other factor is a number, a comparison when it is a tensor.
_ELEMENTWISE = frozenset({"mul", "__mul__", "__rmul__"})


class _SquareWatch(TorchFunctionMode):
    """While a learner's function runs: the first tensor a torch function returns with two axes of at least T
    (a (T, T) matrix), whether PyTorch's fused attention was called, the largest input that one call of
    ``exp``, ``softmax`` or ``logsumexp`` took (``widest``: its name and number of entries), and the most keys that
    one product took at once (``keys``: the product's name and the keys per sequence and head, counted in the
    tensors that hold ``k`` itself, its slices, transposes, copies or scalings; ``*`` with another tensor counts
    as a product)."""

    def __init__(self, T: int, k: torch.Tensor | None = None, batch: int = 1) -> None:
        super().__init__()
        self.T, self.found, self.fused = T, None, False
        self.widest: tuple[str, int] = ("", 0)
        self.keys: tuple[str, int] = ("", 0)
        self.per_key = batch * (k.shape[-1] if k is not None else 1)  # entries of one key over every sequence and head
        self.holds_k: dict[int, weakref.ref[torch.Tensor]] = {} if k is None else {id(k): weakref.ref(k)}

    def _holds_k(self, t: torch.Tensor) -> bool:
        ref = self.holds_k.get(id(t))
        return ref is not None and ref() is t

    def _tensors(self, args: Any, kwargs: Any) -> list[torch.Tensor]:
        flat = [*args, *(kwargs or {}).values()]
        flat = [t for a in flat for t in (a if isinstance(a, (tuple, list)) else (a,))]
        return [t for t in flat if isinstance(t, torch.Tensor)]

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.fused = self.fused or func is F.scaled_dot_product_attention
        name = getattr(func, "__name__", "")
        if name in _EXPONENTIALS:
            scores = args[0] if args else (kwargs or {}).get("input")
            if isinstance(scores, torch.Tensor) and scores.numel() > self.widest[1]:
                self.widest = (name, scores.numel())
        if name in _PRODUCTS or name in _KEEPS_KEYS:
            tensors = self._tensors(args, kwargs)
            held = [t for t in tensors if self._holds_k(t)]
            # `*` between the keys and another tensor of more than one entry (the queries) compares them, as `@` does
            elementwise = name in _ELEMENTWISE and any(t.numel() > 1 and not self._holds_k(t) for t in tensors)
            if held and (name in _PRODUCTS or elementwise):
                keys = max(t.numel() for t in held) // self.per_key
                if keys > self.keys[1]:
                    self.keys = (name, keys)
            elif held:
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor):
                        self.holds_k[id(t)] = weakref.ref(t)
        if self.found is None:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and sum(n >= self.T for n in t.shape) >= 2:
                    self.found = (getattr(func, "__name__", str(func)), tuple(t.shape))
                    break
        return out


_FUSED_RULED_OUT = ("the exercise rules out F.scaled_dot_product_attention: it is what the checker compares with, "
                    "not a way to build it. Fold the tiles into the online softmax yourself")


def _tile_sizes(T: int, C: int) -> list[int]:
    """Positions in each block: C, ..., C and a shorter last block if C does not divide T."""
    return [min(C, T - start) for start in range(0, T, C)]


def _causal_area(T: int, C: int) -> int:
    """Score entries in the tiles at or below the diagonal: query block i times key blocks 0..i."""
    sizes = _tile_sizes(T, C)
    return sum(r * sum(sizes[:i + 1]) for i, r in enumerate(sizes))


def _allowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                       scale: float | None = None) -> torch.Tensor:
    """Attention where query i sees key j iff allowed[i, j]; a query that sees nothing gets 0."""
    Dk = q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) * (Dk ** -0.5 if scale is None else scale)  # (..., T, T)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)  # (..., T, T)
    return weights @ v  # (..., T, Dv)


def _causal_suspects(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int) -> dict[str, torch.Tensor]:
    """Known mistakes in causal tiled attention: {message: the out that mistake gives}."""
    T, Dk = q.shape[-2], q.shape[-1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, 1), (1, T) positions
    bi, bj = i // C, j // C  # block of each query, of each key
    causal = j <= i
    patterns = {
        "every query saw every key, later ones included: the tiles above the diagonal must be skipped, and inside "
        "the diagonal tile the keys after the query masked": torch.ones(T, T, dtype=torch.bool),
        "inside the diagonal tile the keys after the query were not masked: in the tile where a query block meets "
        "its own key block, key j may be seen by query i only if j <= i": bj <= bi,
        "the mask inside the diagonal tile is upside down: of the keys of the query's own block, those at or before "
        "the query are the ones it may see": (bj < bi) | ((bj == bi) & (j >= i)),
        "a query does not see its own key: key j is allowed for j <= i, the diagonal included": j < i,
        "the triangle mask was applied to every tile: only the diagonal tile needs it, since below the diagonal "
        "every key comes before every query": (bj <= bi) & (j % C <= i % C),
        "only the diagonal tile counts in the result: the running quantities must carry over from one key block to "
        "the next, and start afresh only for a new query block": (bj == bi) & causal,
    }
    suspects = {message: _allowed_attention(q, k, v, allowed) for message, allowed in patterns.items()}
    suspects["the scores were not scaled: multiply q_block @ k_block^T by 1/sqrt(Dk), Dk = q.shape[-1]"] = (
        _allowed_attention(q, k, v, causal, scale=1.0))
    suspects[f"the scores were divided by Dk = {Dk}, not by its square root"] = (
        _allowed_attention(q, k, v, causal, scale=1.0 / Dk))
    return suspects


@exercise_check
def check_causal_tiled_attention(fn: Callable[..., Any], seed: int = 0, B: int = 2, H: int = 3, T: int = 11,
                                 Dk: int = 5, Dv: int = 6, block_size: int = 4) -> None:
    """Check a learner's ``causal_tiled_attention(q, k, v, block_size) -> (out, tiles)`` (notebook 09, exercise 2).

    q and k are (B, H, T, Dk), v is (B, H, T, Dv), three different tensors of the
    same T positions. ``out`` is compared with
    ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, values and the
    gradients with respect to q, k and v, and ``tiles`` with the number of tiles
    at or below the diagonal. The work is measured while the function runs:
    its matrix products (``FlopCounterMode``) must not come close to those of
    every tile, and no tensor with two axes of T (the scores, weights or mask of
    every pair) may appear, no product may compare queries with more than C keys at
    once (a score tile wider than C, counted in the tensors that hold k, its slices,
    transposes, copies or scalings; a product is a matrix product, or ``*`` between
    such a tensor and another tensor, as in ``(q_i * k).sum(-1)``), and no call of ``exp``, ``softmax`` or ``logsumexp`` may take
    more scores than one tile holds (C × C for each sequence and head): a query block's
    keys go through the online softmax one tile at a time, not through one ordinary
    softmax. Then scores of about ±200, where exp overflows
    without the running maximum. At the sizes asked for, at B = 1, H = 1, with T
    a multiple of C and not, C = 1, C = T, C > T, T = 1, and with 3-D (B, T, D)
    and 2-D (T, D) inputs.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    C = block_size
    dims = {"B": B, "H": H, "T": T, "Dk": Dk, "Dv": Dv, "C": C}
    cases = shape_cases(dims, ones=("B", "H"), distinct={"B": 2, "H": 3, "T": 11, "Dk": 5, "Dv": 6, "C": 4})
    if T % C:
        cases.append((f"T = {C * -(-T // C)}, a multiple of C = {C}", {**dims, "T": C * -(-T // C)},
                      "when C divides T there is no shorter last block: is there an empty block, or a tile too many, "
                      "at the end?"))
    elif C > 1:
        cases.append((f"T = {T + 1}, not a multiple of C = {C}", {**dims, "T": T + 1},
                      "T need not be a multiple of C: the last block is shorter. Slice with [start:start + C], which "
                      "stops at T, and take each block's size from the slice, not from C"))
    cases += [
        ("C = 1, one position per block", {**dims, "C": 1},
         "with C = 1 each tile is one query and one key; the diagonal tile is the query's own key, which it may see"),
        (f"C = T = {T}, one block", {**dims, "C": T},
         "one block holds every position: the only tile is the diagonal one, and it needs the mask"),
        (f"C = {T + 3} > T, one block", {**dims, "C": T + 3},
         "a block larger than the sequence: slicing [start:start + C] stops at T by itself; the only tile is the "
         "diagonal one"),
        ("T = 1, a single position", {**dims, "T": 1}, "one position, one tile: the query sees only itself"),
    ]
    leading = "the code assumes 4-D inputs: use the last two axes, `-1` and `-2`, whatever the number of leading axes"
    cases += [(f"3-D inputs (B, T, Dk) = {(B, T, Dk)}, without a head axis", {**dims, "H": None}, leading),
              (f"2-D inputs (T, Dk) = {(T, Dk)}, one sequence without a batch axis", {**dims, "B": None, "H": None},
               leading)]
    with reference_guard(fn, efficiency.causal_tiled_attention,
                         ruled_out={F.scaled_dot_product_attention: _FUSED_RULED_OUT}):
        sweep(lambda B, H, T, Dk, Dv, C: _causal_once(fn, seed, tuple(n for n in (B, H) if n is not None), T, Dk, Dv,
                                                      C), cases)
    passed("causal_tiled_attention")


def _causal_once(fn: Callable[..., Any], seed: int, lead: tuple[int, ...], T: int, Dk: int, Dv: int, C: int) -> None:
    """One size of the check: ``lead`` is (B, H), (B,) or () (the leading axes of q, k and v)."""
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    letters = ("B", "H")[:len(lead)]
    dims = {**dict(zip(letters, lead)), "T": T, "Dk": Dk, "Dv": Dv}
    q = 1.5 * torch.randn(*lead, T, Dk, generator=g)
    k = 1.5 * torch.randn(*lead, T, Dk, generator=g)
    v = torch.randn(*lead, T, Dv, generator=g)
    out_letters = " ".join(letters + ("T", "Dv"))
    out_shape = tuple(lead) + (T, Dv)
    n = -(-T // C)  # blocks of positions
    sizes = f"T = {T}, C = {C}: {n} block(s) of positions"
    expected_return = f"a tuple (out ({out_letters.replace(' ', ', ')}) = {out_shape}, tiles, an int)"
    error_hint = ("T need not be a multiple of C (the last block is shorter), and q, k, v may have any number of "
                  "leading axes: slice blocks with [..., start:start + C, :]")

    def run(*args: Any) -> tuple[torch.Tensor, Any]:
        got = call(fn, *args, name="causal_tiled_attention", expected=expected_return, error_hint=error_hint)
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckError(f"expected {expected_return}, got {describe(got)}: return out, tiles")
        return got

    copies = (q.clone(), k.clone(), v.clone())
    watch, counter = _SquareWatch(T, k, math.prod(lead)), FlopCounterMode(display=False)
    with counter, watch:
        out, tiles = run(q, k, v, C)
    if watch.fused:
        raise CheckError(_FUSED_RULED_OUT)
    if not all(torch.equal(a, b) for a, b in zip((q, k, v), copies)):
        raise CheckError("causal_tiled_attention changed q, k or v in place (e.g. masked_fill_ with a trailing "
                         "underscore): use out-of-place operations")
    if isinstance(out, torch.Tensor) and tuple(out.shape) == out_shape and not torch.isfinite(out).all():
        first = tuple((~torch.isfinite(out)).nonzero()[0].tolist())
        raise CheckError(
            f"out is NaN or inf at index {first} ({sizes}): a query with no key at all gives 0 / 0. Every query "
            "block must fold in its diagonal tile, and the mask there must keep the query's own key (j <= i)")
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (..., T, Dv)
    check_close(out, expected, name=f"out ({sizes})", shape=out_letters, dims=dims,
                suspects=_causal_suspects(q, k, v, C),
                hints={tuple(lead) + (T, Dk): "this has the width of q and k: the output is a weighted sum of v",
                       tuple(lead) + (min(C, T), Dv): "one block of queries: concatenate the outputs of every "
                                                        "query block along the positions (dim=-2)"},
                hint="out must equal causal softmax attention: query i weights the keys 0..i by "
                     "softmax(q_i k_j / sqrt(Dk))")
    try:
        count = operator.index(tiles)
    except TypeError:
        raise CheckError(f"the second item must be the number of tiles you computed, an int; got {describe(tiles)}"
                         ) from None
    triangle = n * (n + 1) // 2
    if count != triangle:
        if count == n * n:
            why = "every (query block, key block) pair was counted, n² of them: the tiles above the diagonal are skipped"
        elif count == n * (n - 1) // 2:
            why = "the diagonal tiles were not counted: each query block computes its own diagonal tile too"
        elif count == n:
            why = "one per query block: count every (query block, key block) tile computed"
        else:
            why = "count one for every (query block, key block) tile you compute"
        raise CheckError(f"tiles = {count} for {sizes}: {why}")
    if T > max((*lead, Dk, Dv, C)) and watch.found is not None:
        op, shape = watch.found
        raise CheckError(
            f"your function built a tensor of shape {shape} ({op}), with two axes of T = {T} positions: a matrix "
            "over every (query, key) pair, the scores, the weights or the mask. Tiled attention never holds one: "
            "make each tile's scores and its mask from the positions of that tile only")
    flops = counter.get_total_flops()
    batch = math.prod(lead)
    causal, full = 2 * batch * _causal_area(T, C) * (Dk + Dv), 2 * batch * T * T * (Dk + Dv)
    if n > 1 and flops > (causal + full) / 2:
        raise CheckError(
            f"out is right, but your matrix products did {flops / causal:.1f} times the multiply-adds of the tiles at "
            f"or below the diagonal ({sizes}): tiles above the diagonal were computed (and masked away). Skip them: "
            "query block i needs only the key blocks up to its own")
    op, keys = watch.keys
    if n > 1 and keys > C and op in _ELEMENTWISE:
        raise CheckError(
            f"out is right, but one elementwise product (`*`) compared queries with {keys} keys at once, more than "
            f"the C = {C} keys of one tile ({sizes}): scores made with `*` and `.sum` still have to come one tile at a "
            "time. Cut the keys into blocks of C, score each tile of queries against its keys (a matrix product "
            "does this in one call), and fold the tile in with online_softmax_update (exercise 1)")
    if n > 1 and keys > C:
        raise CheckError(
            f"out is right, but one product (`{op}`) compared queries with {keys} keys at once, a score tile wider "
            f"than C = {C} ({sizes}): the keys were not cut into tiles, so a query block's keys went through one "
            "ordinary softmax together. Cut the keys into blocks of C as well, and fold each tile's scores in with "
            "online_softmax_update (exercise 1), one tile at a time")
    op, widest = watch.widest
    if n > 1 and widest > batch * C * C:
        raise CheckError(
            f"out is right, but one call of `{op}` took {widest // batch} scores of one sequence"
            f"{' and head' * (len(lead) > 1)} at once, more than a tile holds, C × C = {C * C} ({sizes}): a query "
            "block's keys went through one ordinary softmax together, not one tile at a time. Fold each tile's "
            "scores in on their own with online_softmax_update (exercise 1), which never needs more than one tile "
            "at once")
    # Scores of about ±200: exp overflows float32 (above about 88) unless taken relative to the running maximum.
    big_q, big_k = 10 * q, 10 * k
    big_out, _ = run(big_q, big_k, v, C)
    if isinstance(big_out, torch.Tensor) and not torch.isfinite(big_out).all():
        raise CheckError("out is NaN or inf for scores of about ±200: exp overflows float32 above about 88. Fold the "
                         "tiles with online_softmax_update, which exponentiates relative to the running maximum")
    check_close(big_out, F.scaled_dot_product_attention(big_q, big_k, v, is_causal=True),
                name=f"out for scores of about ±200 ({sizes})", shape=out_letters, dims=dims, atol=1e-4,
                hint="the result may depend only on the differences between the scores of a query")
    check_gradients(fn, (q, k, v, C), lambda q_, k_, v_, C_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True),
                    name="causal_tiled_attention", wrt={0: "q", 1: "k", 2: "v"}, what="out", seed=seed)
