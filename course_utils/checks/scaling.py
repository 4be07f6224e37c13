"""Checkers for notebook 04: attention entropy, the saturation width, the per-head scale trained, the effective
scale of attention code.

A checker of a function that computes tensors runs it forward and backward: a
function whose values are right but whose gradient is NaN, inf or missing (a
detour through NumPy, a ``.detach()``) would break the training that uses it.
The two measurements (exercises 2 and 3) are compared with the reference
measurement on the same draws, or the same seed and settings. Messages name
the likely bug; they never show the solution's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_utils.blocks import attention, masks
from course_utils.checks.core import (call, check_close, check_gradients, describe, passed, reference_guard,
                                     shape_cases, sweep)
from course_utils.experiments import scaling
from course_utils.experiments.scaling import RecallConfig, saturation_width
from course_utils.core.errors import CheckError
from course_utils.checks.flow import exercise_check


def _first(result: Any) -> tuple[torch.Tensor, ...]:
    """out, whether a function returns out or (out, weights)."""
    out = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    return (out,) if isinstance(out, torch.Tensor) else ()


@exercise_check
def check_attention_entropy(fn: Callable[[torch.Tensor], Any], seed: int = 0, B: int = 2, T: int = 3,
                            S: int = 5) -> None:
    """Check a learner's ``attention_entropy(weights) -> (B, T)`` in nats (notebook 04, exercise 1).

    The weights include one-hot rows and zeros (masked keys), where 0 · log 0
    must count as 0, in the forward pass and in the backward pass: the
    gradient with respect to the weights must be finite everywhere (a NaN at
    a masked key would spread through the softmax to every score). As the
    rows sum to 1, the gradient is compared up to a constant in each row, which
    no loss sees through the softmax that made the weights: an entropy that
    renormalises (``torch.distributions.Categorical``) is right. Tried on
    (B, T, S) weights at the sizes asked for, at B = 1, T = 1 and sizes that
    all differ, and on (B, H, T, S) weights with a head axis.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    cases = shape_cases({"B": B, "T": T, "S": S}, ones=("B", "T"), distinct={"B": 2, "T": 3, "S": 5})
    cases.append((f"(B, H, T, S) = {(B, 3, T, S)} weights, with a head axis", {"B": B, "T": T, "S": S, "H": 3},
                  "the code assumes 3-D weights: the keys are the last axis, the queries the one before, whatever "
                  "the number of leading axes"))
    with reference_guard(fn, attention.attention_entropy):
        sweep(lambda B, T, S, H=None: _entropy_once(fn, seed, (B,) if H is None else (B, H), T, S), cases)
    passed("attention_entropy")


def _entropy_once(fn: Callable[[torch.Tensor], Any], seed: int, lead: tuple[int, ...], T: int, S: int) -> None:
    __tracebackhide__ = True  # noqa: F841
    g = torch.Generator().manual_seed(seed)
    B = lead[0]
    letters = ("B", "H")[:len(lead)]
    dims = {**dict(zip(letters, lead)), "T": T, "S": S}
    scores = 2 * torch.randn(*lead, T, S, generator=g)
    mask = masks.padding_mask(torch.tensor([S] + [max(1, S - 2)] * (B - 1)), S)  # (B, 1, S): some keys masked
    mask = mask.reshape(B, *[1] * (len(lead) - 1), 1, S)  # (B, 1, S) or (B, 1, 1, S)
    weights = attention.masked_softmax(scores, mask)  # (..., T, S), zeros on masked keys
    weights[(0,) * (len(lead) + 1)] = torch.nn.functional.one_hot(torch.tensor(min(1, S - 1)), S).float()  # entropy 0
    weights_copy = weights.clone()
    out_shape = (*lead, T)
    got = call(fn, weights, name="attention_entropy",
               expected=f"entropies of shape ({', '.join(letters + ('T',))}) = {out_shape}")
    if not torch.equal(weights, weights_copy):
        raise CheckError("attention_entropy changed `weights` in place: use out-of-place operations")
    expected = attention.attention_entropy(weights)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == out_shape and torch.isnan(got).any():
        raise CheckError("some entropies are NaN: a weight of exactly 0 (a masked key) gives 0 · log 0 = 0 · (-inf) "
                         "= NaN, a term the convention counts as 0")
    suspects = {
        "the minus sign is missing: an entropy is never negative": -expected,
        "this is in bits (a base-2 log): the course measures entropy in nats (the natural log)":
            expected / torch.log(torch.tensor(2.0)),
        "this is a mean over the keys: the entropy is a sum over them": expected / S,
    }
    hints = {
        (*lead, S): "you summed over the queries: the entropy of query i sums over its own keys",
        (*lead, T, S): "the terms are not yet summed over the keys",
        (): "a single number: return one entropy per query, (..., T)",
    }
    check_close(got, expected, name="entropies", shape=" ".join(letters + ("T",)), dims=dims, hints=hints,
                suspects=suspects, hint="it is none of the usual mistakes: compare each term with the exercise's formula, and check "
                     "what the masked keys (weight 0) contribute")
    # The weights sum to 1, so only the gradient along that constraint matters: a gradient that differs by a
    # constant in each row (torch.distributions.Categorical renormalises the weights, which gives one) is the same
    # gradient for the softmax, or any normalisation, that made the weights. Normalising the rows inside both
    # functions compares the gradients up to that constant; a NaN or inf still spreads to every entry of its row.
    check_gradients(lambda w: fn(w / w.sum(dim=-1, keepdim=True)), (weights,),
                    lambda w: attention.attention_entropy(w / w.sum(dim=-1, keepdim=True)), name="attention_entropy",
                    wrt={0: "the weights"}, what="the entropies", seed=seed, compare_where={0: weights > 0},
                    not_finite=" at the weights that are exactly 0: the backward pass still goes through "
                               "log 0 = -inf there (and 0 · -inf = NaN), even where the forward pass counted "
                               "the term as 0. Through the softmax, a NaN at one masked key reaches every score")


# --- exercise 3: an experiment, graded against the reference experiment on the same seed and settings ---------

_RUNS = ("head width", "model width")


def _small_recall(width: int) -> RecallConfig:
    """A recall task small enough to train twice in a check: queries, keys and values ``width`` wide, embeddings
    ``width + 4`` (so that an answer reading the width from ``config.D`` instead of ``config.Dk`` gets another run)."""
    return RecallConfig(Dk=width, Dv=width, D=width + 4, num_pairs=5, num_keys=12, num_values=10, batch_size=16, steps=6,
                        lr=1e-2, test_size=40)


def _same_run(losses: Any, reference: list[float]) -> bool:
    return (isinstance(losses, list) and len(losses) == len(reference)
            and all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, reference)))


@exercise_check
def check_head_scale_runs(fn: Callable[..., Any], seed: int = 0, H: int = 4, Dh: int = 6) -> None:
    """Check a learner's ``head_scale_runs(config, H, seed) -> {"head width": losses, "model width": losses}`` (04, 3).

    An experiment, graded against the reference experiment: on a small recall
    task (a few steps, queries ``H * Dh`` wide), each of the learner's runs is
    compared, loss by loss, with the reference's run at the same seed and
    settings, at ``seed`` and at ``seed + 1``. A run that is another experiment is named: the two runs swapped,
    a run with no scale, with the scale applied twice (divided by the width,
    not its square root), with the divisor passed as the factor, with a factor
    of another width (the number of heads), with one head, or from another
    seed. The sizes are chosen so that these factors all differ. The message
    never says which run trains faster.

    Raises:
        CheckError: Naming the likely bug.
    """
    __tracebackhide__ = True  # noqa: F841
    config = _small_recall(H * Dh)
    for run_seed in (seed, seed + 1):  # two seeds: the runs must follow the seed passed in
        with reference_guard(fn, scaling.head_scale_runs):
            got = call(fn, config, H, run_seed, name="head_scale_runs",
                       expected='a dict {"head width": losses, "model width": losses}, the losses of two train_recall runs')
        if not isinstance(got, dict) or set(got) != set(_RUNS):
            keys = sorted(got) if isinstance(got, dict) else None
            raise CheckError(f"head_scale_runs returned "
                             f"{describe(got) if keys is None else f'a dict with the keys {keys}'}"
                             ': return a dict with exactly the two keys "head width" and "model width"')
        for name in _RUNS:
            if not (isinstance(got[name], list) and all(isinstance(x, float) for x in got[name])):
                what = "a list, not of floats" if isinstance(got[name], list) else f"a {type(got[name]).__name__}"
                raise CheckError(f"got[{name!r}] is {what}: each value is the list of the run's "
                                 "training losses (the `losses` of what train_recall returns), not the run itself, "
                                 "its steps to learn or the model")
        reference = scaling.head_scale_runs(config, H, run_seed)
        for name in _RUNS:
            if not _same_run(got[name], reference[name]):
                raise CheckError(_which_run(got, name, config, H, Dh, run_seed))
    passed("head_scale_runs")


def _which_run(got: dict[str, Any], name: str, config: RecallConfig, H: int, Dh: int, seed: int) -> str:
    """What the learner's run ``name`` is, among the runs the usual mistakes give."""
    __tracebackhide__ = True  # noqa: F841
    Dk = H * Dh  # the queries' width before the split (config.Dk)
    right = {"head width": Dh**-0.5, "model width": Dk**-0.5}
    other = _RUNS[1 - _RUNS.index(name)]
    factors = {  # a factor on every head's scores -> what it is, in words
        right[other]: f"the factor of the {other!r} run",
        1.0: "1: the scores were not scaled at all",
        1 / Dh: f"1/Dh = 1/{Dh}: divided by Dh itself, not by its square root (or the scale applied twice)",
        1 / Dk: f"1/Dk = 1/{Dk}: divided by the width itself, not by its square root (or the scale applied twice)",
        Dh**0.5: "sqrt(Dh): `scale=` is the factor that multiplies the scores, and this passed the divisor",
        Dk**0.5: "sqrt(Dk): `scale=` is the factor that multiplies the scores, and this passed the divisor",
        H**-0.5: f"1/sqrt(H) = 1/sqrt({H}): the number of heads does not enter a head's dot product",
        1 / H: f"1/H = 1/{H}: the number of heads does not enter a head's dot product",
        config.D**-0.5: f"1/sqrt(config.D) = 1/sqrt({config.D}): config.D is the width of the token embeddings; the "
                        "queries' width before the split is config.Dk",
    }
    losses = got[name]  # the learner's run, as its losses
    where = f'got[{name!r}] (H = {H}, Dh = {Dh}, Dk = H · Dh = {Dk}, seed = {seed})'
    for factor, words in factors.items():
        if _same_run(losses, scaling.train_recall(config, seed=seed, scale=factor, heads=H).losses):
            if factor == right[other] and _same_run(got[other], scaling.train_recall(config, seed=seed,
                                                                                      scale=right[name], heads=H).losses):
                return (f"the two runs are swapped: got[{name!r}] is the {other!r} experiment and the other way round. "
                        "Check which width each key names")
            return f"{where} multiplies every head's scores by {words}"
    if _same_run(losses, scaling.train_recall(config, seed=seed, scale=right[name]).losses):
        return (f"{where} trained a model with one head: both runs must train the model split into H heads, so that "
                "each head's dot products sum over its own Dh numbers")
    if seed != 0 and _same_run(losses, scaling.train_recall(config, seed=0, scale=right[name], heads=H).losses):
        return (f"{where} is the run of seed 0, not of the seed passed in: pass `seed` on, so that both runs start "
                "from the same weights and see the same batches as the reference's")
    reference = scaling.train_recall(config, seed=seed, scale=right[name], heads=H).losses
    if len(losses) != len(reference):
        return (f"{where} has {len(losses)} losses, not one per training step of `config`: train with the config "
                "passed in, unchanged")
    first = next(i for i, (a, b) in enumerate(zip(losses, reference)) if abs(a - b) > 1e-5 * max(1.0, abs(b)))
    return (f"{where} is none of the usual mistakes: its losses leave the reference experiment's at step {first + 1}. "
            "Check the model (H heads), the factor on the scores, the seed and the config, each as passed in")


@exercise_check
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
    check_gradients(fn, (q, k, v), attention.scaled_dot_product_attention, name="attention",
                    wrt={0: "q", 1: "k", 2: "v"}, what="the outputs", seed=seed, outputs=_first)
    passed("attention scale")


# --- exercise 2: a measurement, graded against the reference measurement on the same draws -------------------

_WIDTHS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]

# Known mistakes: what each returns, and the generator's state it leaves, come from _width_with(mistake, ...).
_WIDTH_MISTAKES = {
    "scaled": "the scores were divided by sqrt(Dk): this exercise measures the softmax *without* the scale, whose "
              "weights pile up on one key as Dk grows (with the scale they do not, section 3)",
    "softmax over queries": "the softmax was taken over the queries: each query's weights sum to 1 over the keys "
                            "(with S = 1, a `.squeeze()` that drops the key axis does this too)",
    "keys first": "the keys were drawn before the queries: a measurement on the same generator can be repeated (and "
                  "compared with the reference's) only with the same draws in the same order, q and then k",
    "float64": "q and k were drawn in float64: the same generator gives other numbers in another dtype; draw them "
               "in float32, torch.randn's default",
    "keys per query": "every query got keys of its own, (T, S, Dk): here all T queries attend over the same S keys, "
                      "like the tokens of one sequence, drawn once per width as (S, Dk)",
    "median": "this is the median of the queries' largest weights, not their mean: the two differ a lot here, "
              "because the mean also counts the few queries that split their weight between keys",
    "overall max": "this compares the single largest weight of all queries with the threshold: take each query's "
                   "largest weight, then their mean over the T queries",
    "at least": "a mean weight equal to the threshold passed: 'more than' is `>`, not `>=`",
    "fixed threshold": "the threshold passed in was not used: compare with the argument `threshold`, whatever it is",
    "naive softmax": "the softmax overflowed: exp of an unscaled score passes float32's limit (scores above about "
                     "88) in wide heads, inf / inf = NaN, and NaN is never more than the threshold. torch.softmax "
                     "subtracts each row's largest score before exp, which leaves the weights unchanged",
    "last": "this is the last width that passes, not the first: stop at the first width whose mean passes",
    "draw all": "your function went on drawing for the widths after the first that passes: stop there, so that the "
                "generator is left as the exercise says",
}


@exercise_check
def check_saturation_width(fn: Callable[..., Any], seed: int = 0, S: int = 16, T: int = 48) -> None:
    """Check a learner's ``saturation_width(Dks, S, T, generator, threshold)`` (notebook 04, exercise 2).

    A measurement: the width it returns is compared with the reference
    measurement on a generator in the same state (the draws the exercise
    prescribes), and so is the generator's state afterwards (the same numbers
    drawn, none after the first width that passes). It returns a width, not a
    tensor, so there is no gradient to check. Tried at the sizes asked for
    (S ≠ T), with one query (T = 1), with one key (S = 1: weight 1, so the
    first width passes), on widths that are not powers of two with another
    threshold, on wide heads only (where exp of an unscaled score overflows),
    with a threshold no mean weight exceeds (1) and with one that the first
    width passes (0). A wrong answer is compared, on every case, with what the
    usual mistakes return and the state they leave, and the mistake is named.

    Raises:
        CheckError: Naming the likely bug; never the expected width.
    """
    __tracebackhide__ = True  # noqa: F841
    uneven = [3, 10, 30, 100, 300, 1000]
    cases = [
        (f"(S, T) = ({S}, {T})", {"Dks": _WIDTHS, "S": S, "T": T, "threshold": 0.9}, ""),
        ("T = 1 query", {"Dks": _WIDTHS, "S": S, "T": 1, "threshold": 0.9},
         "with one query, the mean is that query's largest weight: check the axis you take the largest weight over, "
         "the one you average over, and any `.squeeze()`"),
        ("S = 1 key", {"Dks": _WIDTHS, "S": 1, "T": T, "threshold": 0.9},
         "a single key gets all the weight, exactly 1, at every width, so the first width passes: is the softmax "
         "over the keys, even when a `.squeeze()` could drop that axis?"),
        (f"the widths {uneven}, threshold 0.5", {"Dks": uneven, "S": S + 3, "T": T, "threshold": 0.5},
         "try the widths of Dks themselves, in the order given, against the threshold passed in"),
        ("wide heads only, the widths [1500, 3000]", {"Dks": [1500, 3000], "S": S, "T": T, "threshold": 0.9},
         "unscaled scores of wide heads reach hundreds: is every step safe from overflow in float32?"),
        ("threshold 1 with S = 1", {"Dks": _WIDTHS[:4], "S": 1, "T": T, "threshold": 1.0},
         "no mean weight is more than 1, not even a single key's weight of exactly 1: 'more than' is `>`, and when "
         "no width passes the answer is None"),
        ("threshold 0", {"Dks": _WIDTHS, "S": S, "T": T, "threshold": 0.0},
         "every softmax puts more than 0 on its largest weight, so the first width passes"),
    ]
    with reference_guard(fn, saturation_width):
        answers = [_saturation_width_answer(fn, seed, label, i, **sizes) for i, (label, sizes, _) in enumerate(cases)]
    for i, ((label, sizes, likely), (got, state)) in enumerate(zip(cases, answers)):
        reference = _used_generator(seed)
        expected = saturation_width(list(sizes["Dks"]), sizes["S"], sizes["T"], reference, sizes["threshold"])
        if got == expected and torch.equal(state, reference.get_state()):
            continue
        where = f"works for {cases[0][0]} but fails for {label}: " if i else ""
        for mistake, message in _WIDTH_MISTAKES.items():  # a mistake that gives the same answers on every case
            if all(_width_with(mistake, generator=_used_generator(seed), **case) == answer[0]
                   and torch.equal(_used_generator(seed, mistake, **case), answer[1])
                   for (_, case, _), answer in zip(cases, answers)):
                raise CheckError(f"{where}saturation_width returned {got}, not the reference measurement's width: "
                                 f"{message}" if got != expected else f"{where}the right width, but {message}")
        Dks = sizes["Dks"]
        if got is not None and expected is not None and Dks.index(got) == Dks.index(expected) - 1:
            raise CheckError(f"{where}saturation_width returned {got}, off by one width: that is the last width that "
                             "does not pass. Return the first width whose mean largest weight is more than the threshold")
        if got == expected:
            raise CheckError(f"{where}the right width, but not the right draws: the generator is left in another state "
                             "than after the reference. For each width, in order, draw q of shape (T, Dk) and then k of "
                             "shape (S, Dk), in float32, and nothing else")
        raise CheckError(
            f"{where}saturation_width returned {got}, not the reference measurement's width on a generator in the same "
            "state, and it is none of the usual mistakes. Check, for each width of Dks in order: the draws (q of shape "
            "(T, Dk), then k of shape (S, Dk), float32, from generator), the scores without a scale, the softmax over "
            "the keys, each query's largest weight, their mean over the T queries, and 'more than' the threshold"
            + (f"\n  likely cause: {likely}" if likely else ""))
    passed("saturation_width")


def _used_generator(seed: int, mistake: str | None = None, **case: Any) -> Any:
    """A generator in a known state that has been used before, as in a notebook that measures one setting after
    another; with ``mistake``, the state it is left in by ``_width_with(mistake, **case)``."""
    generator = torch.Generator().manual_seed(seed)
    torch.randn(5, generator=generator)
    if mistake is None:
        return generator
    _width_with(mistake, generator=generator, **case)
    return generator.get_state()


def _width_with(mistake: str, Dks: list[int], S: int, T: int, generator: torch.Generator,
                threshold: float) -> int | None:
    """What ``saturation_width`` returns with one known mistake (a key of ``_WIDTH_MISTAKES``)."""
    passing = []
    threshold = 0.9 if mistake == "fixed threshold" else threshold
    for Dk in Dks:
        dtype = torch.float64 if mistake == "float64" else torch.float32
        if mistake == "keys first":
            k = torch.randn(S, Dk, generator=generator)  # (S, Dk)
            q = torch.randn(T, Dk, generator=generator)  # (T, Dk)
        else:
            q = torch.randn(T, Dk, generator=generator, dtype=dtype)  # (T, Dk)
            k = torch.randn(*((T,) if mistake == "keys per query" else ()), S, Dk, generator=generator, dtype=dtype)
        scores = (q[:, None, :] * k).sum(dim=-1) if k.dim() == 3 else q @ k.T  # (T, S)
        if mistake == "scaled":
            scores = scores / Dk**0.5
        if mistake == "naive softmax":
            weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)  # (T, S), NaN where exp overflows
        else:
            weights = torch.softmax(scores, dim=0 if mistake == "softmax over queries" else -1)  # (T, S)
        largest = weights.amax(dim=-1)  # (T,)
        stat = largest.median() if mistake == "median" else weights.max() if mistake == "overall max" else largest.mean()
        if stat >= threshold if mistake == "at least" else stat > threshold:
            if mistake not in ("last", "draw all"):
                return Dk
            passing.append(Dk)
    if mistake == "draw all":
        return passing[0] if passing else None
    return passing[-1] if passing else None


def _saturation_width_answer(fn: Callable[..., Any], seed: int, label: str, i: int, Dks: list[int], S: int, T: int,
                             threshold: float) -> tuple[int | None, torch.Tensor]:
    """The learner's width for one case and the generator's state after it; the checks that need no reference."""
    __tracebackhide__ = True  # noqa: F841
    where = f"for {label}: " if i else ""
    generator = _used_generator(seed)
    start = generator.get_state()
    widths = list(Dks)
    try:
        got = call(fn, widths, S, T, generator, threshold, name="saturation_width",
                   expected="a width from Dks (an int), or None if no width passes")
    except CheckError as err:
        raise type(err)(f"{where}{err}") from None
    if widths != Dks:
        raise CheckError("saturation_width changed the list Dks in place: read it, without sorting, extending or "
                         "popping it")
    if isinstance(got, bool) or not (got is None or isinstance(got, int)):
        raise CheckError(f"saturation_width returned {describe(got)}: return the width itself, a Python int taken "
                         "from Dks (not a tensor, and not the mean weight), or None if no width passes")
    if got is not None and got not in Dks:
        raise CheckError(f"{where}saturation_width returned {got}, which is not one of the widths in Dks"
                         + (": did you return a position in Dks (an index) instead of the width there?"
                            if 0 <= got < len(Dks) else ""))
    if torch.equal(generator.get_state(), start):
        raise CheckError("saturation_width drew no numbers from `generator`: pass generator=generator to every "
                         "torch.randn, so that the measurement can be repeated and compared with the reference's "
                         "on the same draws")
    return got, generator.get_state()
