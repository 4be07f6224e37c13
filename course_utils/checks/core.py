"""Common core of every checker: tensor and closeness checks, running a learner's
function, and messages that name the likely bug."""

from __future__ import annotations

import inspect
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from types import FrameType
from typing import Any

import torch

from course_utils.core.errors import CheckError, ExerciseOpen


def describe(x: Any) -> str:
    """Short description of a value for a message: type, shape, dtype."""
    if x is None:
        return "None"
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    if isinstance(x, torch.nn.Module):
        return f"a {type(x).__name__} module"
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"a {type(x).__module__.split('.')[0]} {type(x).__name__} of shape {tuple(shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} item(s)"
    return f"a {type(x).__name__} ({x!r:.40})"


def _format_shape(letters: str, dims: Mapping[str, int]) -> str:
    names = letters.split()
    return f"({', '.join(names)}) = {tuple(dims[n] for n in names)}"


def _learner_line(exc: BaseException) -> str:
    """The last traceback line that is not inside torch or course_utils, as 'line N: code'."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        fname = frame.filename.replace("\\", "/")
        if "/torch/" in fname or "/course_utils/" in fname:
            continue
        code = (frame.line or "").strip()
        return f"line {frame.lineno} of {frame.name}(): `{code}`" if code else f"line {frame.lineno} of {frame.name}()"
    return "the first line of your function"


def call(fn: Callable[..., Any], *args: Any, name: str | None = None, expected: str = "a tensor",
         error_hint: str = "") -> Any:
    """Call a learner's function; turn a missing answer or an exception into a ``CheckError``.

    Args:
        fn: The learner's function.
        *args: Arguments to pass.
        name: Name used in messages (defaults to ``fn.__name__``).
        expected: What the function should return, for the message.
        error_hint: Added to the message when ``fn`` raises (the likely cause).

    Returns:
        Whatever ``fn`` returned (not checked here).

    Raises:
        CheckError: If ``fn`` is not callable, is not written yet, or raises.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
    name = name or getattr(fn, "__name__", "your function")
    if fn is None or not callable(fn):
        raise CheckError(f"expected a function for {name}, got {describe(fn)}: pass the function itself, without calling it")
    guard = _GUARD.get()
    try:
        with guard.watching() if guard is not None else nullcontext():
            return fn(*args)
    except NotImplementedError:
        raise ExerciseOpen(
            f"{name} is not written yet: replace `raise NotImplementedError()` with your code. "
            f"It should return {expected}."
        ) from None
    except Exception as exc:  # noqa: BLE001 - any learner exception becomes a message
        shapes = ", ".join(describe(a) for a in args)
        raise CheckError(
            f"{name} raised {type(exc).__name__}: {exc}\n"
            f"  called with: {shapes}\n"
            f"  expected it to return {expected}\n"
            f"  look at {_learner_line(exc)}"
            + (f"\n  likely cause: {error_hint}" if error_hint else "")
        ) from None


def check_tensor(
    got: Any,
    *,
    name: str,
    shape: str | None = None,
    dims: Mapping[str, int] | None = None,
    dtype: torch.dtype | None = None,
    hints: Mapping[tuple[int, ...], str] | None = None,
    allow_nan: bool = False,
) -> torch.Tensor:
    """Check type, shape, dtype and finiteness of a learner's tensor.

    Args:
        got: The value to check.
        name: Its name in messages, e.g. ``"weights"``.
        shape: Expected shape as dimension letters, e.g. ``"B T S"``.
        dims: Size of each letter, e.g. ``{"B": 2, "T": 4, "S": 6}``.
        dtype: Expected dtype, or None for any.
        hints: Likely cause for a wrong shape, keyed by that wrong shape.
        allow_nan: Accept NaN / inf values.

    Returns:
        ``got``, now known to be a tensor of the right shape and dtype.

    Raises:
        CheckError: With expected vs got and the likely cause.
    """
    __tracebackhide__ = True  # noqa: F841
    want = _format_shape(shape, dims) if shape is not None and dims is not None else "a tensor"
    if got is None:
        raise CheckError(f"expected {name} of shape {want}, got None: did you forget to `return` it?")
    if not isinstance(got, torch.Tensor):
        raise CheckError(f"expected {name} to be a torch.Tensor of shape {want}, got {describe(got)}")
    if shape is not None and dims is not None:
        expected_shape = tuple(dims[n] for n in shape.split())
        if tuple(got.shape) != expected_shape:
            message = f"expected {name} of shape {want}, got {tuple(got.shape)}"
            hint = (hints or {}).get(tuple(got.shape))
            if hint is None and sorted(got.shape) == sorted(expected_shape) and got.dim() == len(expected_shape):
                hint = "the right sizes in the wrong order: check which dimensions you transposed or permuted"
            if hint is None and got.dim() != len(expected_shape):
                hint = f"{got.dim()} dimensions instead of {len(expected_shape)}: check which dimension you summed over, squeezed or added"
            raise CheckError(message + (f": {hint}" if hint else ""))
    if dtype is not None and got.dtype != dtype:
        raise CheckError(f"expected {name} with dtype {dtype}, got {got.dtype}")
    if not allow_nan and got.is_floating_point() and not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).nonzero()
        first = tuple(bad[0].tolist())
        raise CheckError(
            f"{name} contains {len(bad)} NaN/inf value(s), the first at index {first}: "
            "look for a softmax over a row whose scores are all -inf, or a division by zero"
        )
    return got


def check_close(
    got: Any,
    expected: torch.Tensor,
    *,
    name: str,
    shape: str | None = None,
    dims: Mapping[str, int] | None = None,
    suspects: Mapping[str, torch.Tensor] | None = None,
    hints: Mapping[tuple[int, ...], str] | None = None,
    hint: str = "",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Compare a learner's tensor with the expected one; recognise known mistakes.

    Args:
        got: The learner's value.
        expected: The right answer.
        name: Its name in messages.
        shape: Dimension letters of the expected shape, e.g. ``"B T S"``.
        dims: Size of each letter.
        suspects: ``{description of a mistake: what that mistake returns}``;
            when ``got`` matches one, the message names that mistake.
        hints: Likely cause for a wrong shape, keyed by that wrong shape.
        hint: What to look at when the values are wrong for an unknown reason.
        atol: Absolute tolerance.
        rtol: Relative tolerance.

    Raises:
        CheckError: With the mistake recognised, or where the values differ (never the expected value).
    """
    __tracebackhide__ = True  # noqa: F841
    if shape is None:
        shape = " ".join(f"d{i}" for i in range(expected.dim()))
        dims = {f"d{i}": n for i, n in enumerate(expected.shape)}
    check_tensor(got, name=name, shape=shape, dims=dims, dtype=expected.dtype, hints=hints,
                 allow_nan=not torch.isfinite(expected).all().item())
    if torch.allclose(got, expected, atol=atol, rtol=rtol, equal_nan=True):
        return
    for mistake, value in (suspects or {}).items():
        if value.shape == got.shape and torch.allclose(got, value, atol=atol, rtol=rtol, equal_nan=True):
            raise CheckError(f"{name}: right shape, wrong values: {mistake}")
    diff = (got - expected).abs().nan_to_num(float("inf"))
    wrong = diff > atol + rtol * expected.abs()
    # How many, by how much at most (2 significant digits) and the first wrong entry in reading order: all three
    # stay the same on another CPU, where the *largest* of several near-equal differences may not. Never the
    # expected value: a checker names the bug, it does not hand out answers.
    first = tuple(int(i) for i in wrong.nonzero()[0]) if wrong.any() else tuple(0 for _ in diff.shape)
    raise CheckError(
        f"{name}: right shape, wrong values. {int(wrong.sum())} of {diff.numel()} entries differ from the reference, "
        f"by up to {diff.max().item():.2g}; the first is at index {first}, where you returned {got[first].item():.4f}."
        + (f" Hint: {hint}" if hint else "")
    )


def expect_failure(check: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Run a check that should fail on a buggy answer; print its message.

    Used in the "Common pitfalls" sections to show a check catching a bug
    without leaving an error (and a traceback) in the notebook.

    Returns:
        The check's message.

    Raises:
        AssertionError: If the check passed although it should have failed.
    """
    try:
        check(*args, **kwargs)
    except CheckError as err:
        message = getattr(err, "finding", None) or str(err)  # the bug, without the advice to a learner who is stuck
        print(f"check failed, as it should:\n  {message}")
        return message
    raise AssertionError(f"{getattr(check, '__name__', 'the check')} accepted an answer it should reject")


def passed(what: str) -> None:
    print(f"✓ {what}: all checks passed")


# --- the learner's function must not be, or call, the course's reference ------------------------


class _Guard:
    """The functions a checker watches for, and the calls of them seen so far."""

    def __init__(self, messages: Mapping[Callable[..., Any], str]) -> None:
        # by identity: two code objects compiled from the same text compare equal, and a learner's own copy
        # of the reference's code is the learner's function, not a call of the reference. A Python function
        # is recognised by its code object (a "call" event), a built-in by itself (a "c_call" event).
        # A decorated function (``@torch.no_grad()``, ``functools.wraps``) is watched by the code it wraps: every
        # wrapper made by one decorator shares that decorator's code object.
        codes = {f: getattr(inspect.unwrap(f), "__code__", f) for f in messages}
        self.watched = {id(code): (code, messages[f]) for f, code in codes.items()}
        self.seen: list[str] = []

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Record every call of a watched function (at any depth) while the learner's function runs."""

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            target = frame.f_code if event == "call" else arg if event == "c_call" else None
            watched, message = self.watched.get(id(target), (None, ""))
            if target is not None and watched is target:
                self.seen.append(message)

        previous = sys.getprofile()
        if previous is not None:  # a profiler (cProfile, %prun) is running: leave it alone, watch nothing
            yield
            return
        sys.setprofile(profile)
        try:
            yield
        finally:
            sys.setprofile(None)


_GUARD: ContextVar[_Guard | None] = ContextVar("_GUARD", default=None)


def _dotted(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"


@contextmanager
def reference_guard(fn: Any, *references: Callable[..., Any],
                    ruled_out: Mapping[Callable[..., Any], str] | None = None) -> Iterator[None]:
    """Reject a learner's function that is, or calls, the course's reference for the same job.

    ``fn`` itself is compared with every reference at once (``fn is reference``, or the
    same code object). While the block runs, every call of the learner's function made
    through :func:`call` is watched by a profile hook that recognises the references'
    code objects, so an alias, an import inside the function or a call through another
    course function is seen as well (nothing is watched while a profiler runs). A call is
    reported when the block ends without another failure, so a function that calls the
    reference *wrongly* is still told its real bug.

    Args:
        fn: The learner's function.
        *references: Functions of the course that do the exercise's job.
        ruled_out: Other functions the exercise text forbids (Python functions or
            built-ins), with the message to give.

    Raises:
        CheckError: If ``fn`` is a reference, or called one (or a ruled-out function).
    """
    __tracebackhide__ = True  # noqa: F841
    messages: dict[Callable[..., Any], str] = {}
    for reference in references:
        messages[reference] = (f"your function calls the course's reference `{_dotted(reference)}`; "
                               "write it yourself from the formula")
        if fn is reference or getattr(inspect.unwrap(fn), "__code__", None) is inspect.unwrap(reference).__code__:
            raise CheckError(f"this is the course's reference `{_dotted(reference)}` itself, not your function: "
                             "write it yourself from the formula")
    messages.update(ruled_out or {})
    guard = _Guard(messages)
    token = _GUARD.set(guard)
    try:
        yield
    finally:
        _GUARD.reset(token)
    if guard.seen:
        raise CheckError(guard.seen[0])


# --- gradients: run backward through the learner's function and the reference ------------------

_CUT = "`.detach()`, `torch.no_grad()`, `.data`, or a detour through NumPy or torch.tensor(...)"


def _float_outputs(result: Any) -> tuple[torch.Tensor, ...]:
    """The floating-point tensors a function returned: itself, or the items of a tuple or list."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return tuple(t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point())


def _listed(names: list[str]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def check_gradients(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    reference: Callable[..., Any],
    *,
    name: str,
    wrt: Mapping[int, str],
    what: str,
    seed: int = 0,
    outputs: Callable[[Any], tuple[torch.Tensor, ...]] = _float_outputs,
    compare_where: Mapping[int, torch.Tensor] | None = None,
    not_finite: str = "",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Backward through the learner's function and the reference; compare the input gradients.

    Both get fresh leaf copies of the inputs ``wrt`` and the same random upstream
    gradient for each output (``torch.autograd.grad`` of ``sum(out * upstream)``).
    Call it after the values were checked: it reports only what the gradient adds.

    Args:
        fn: The learner's function.
        args: Its arguments (the tensors in ``wrt`` are copied, never modified).
        reference: The course's function for the same job, called with the same arguments.
        name: The function's name in messages.
        wrt: ``{position in args: name in messages}`` of the inputs to differentiate.
        what: What the function returns, for messages, e.g. ``"the weights"``.
        seed: Seeds the upstream gradients.
        outputs: Picks the differentiable outputs from a returned value.
        compare_where: ``{position: bool mask}``: compare that gradient only there
            (it must still be finite everywhere).
        not_finite: The likely cause of a NaN or inf gradient, added to that message.
        atol: Absolute tolerance.
        rtol: Relative tolerance.

    Raises:
        CheckError: If the output is cut off from autograd, a gradient is missing,
            NaN or inf where the reference's is finite, or different.
    """
    __tracebackhide__ = True  # noqa: F841

    def leaves() -> list[Any]:
        return [a.detach().clone().requires_grad_(True) if i in wrt else a for i, a in enumerate(args)]

    g = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        ref_args = leaves()
        ref_outs = outputs(reference(*ref_args))
        upstream = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in ref_outs]
        want = torch.autograd.grad(sum((o * u).sum() for o, u in zip(ref_outs, upstream)),
                                   [ref_args[i] for i in wrt], allow_unused=True)
        mine = leaves()
        got = call(fn, *mine, name=name, expected=f"{what} again, now for inputs that require a gradient",
                   error_hint="it works on tensors that need no gradient and fails on ones that do: a detour through "
                              "NumPy (.numpy()), or an in-place change of an input, breaks autograd")
        outs = outputs(got)
        linked = [(o, u) for o, u in zip(outs, upstream) if o.shape == u.shape and o.grad_fn is not None]
        if not linked:
            raise CheckError(f"{what} have the right values but are cut off from autograd ({_CUT}), so no gradient "
                             f"can flow back through them to {_listed(list(wrt.values()))}")
        grads = torch.autograd.grad(sum((o * u).sum() for o, u in linked), [mine[i] for i in wrt], allow_unused=True)
    names = list(wrt.values())
    reference_grads = [torch.zeros_like(args[i]) if w is None else w for i, w in zip(wrt, want)]
    missing = [n for n, grad, w in zip(names, grads, reference_grads)
               if (grad is None or not grad.any()) and w.any()]
    if missing:
        raise CheckError(f"{what} have the right values, but the gradient with respect to {_listed(missing)} is "
                         f"{'missing' if len(missing) == len(names) else 'zero'}: is that input (or something computed "
                         f"from it) cut off from autograd? {_CUT} cut the gradient, so no gradient can flow back "
                         f"through them to {_listed(missing)}")
    for position, leaf_name, grad, w in zip(wrt, names, grads, reference_grads):
        grad = torch.zeros_like(w) if grad is None else grad
        if not torch.isfinite(grad[torch.isfinite(w)]).all():
            raise CheckError(f"{what} have the right values, but their gradient with respect to {leaf_name} is NaN "
                             f"or inf{not_finite}: one training step with it would turn every weight of a model into NaN")
        where = (compare_where or {}).get(position)
        g_cmp, w_cmp = (grad, w) if where is None else (grad[where], w[where])
        close = torch.isclose(g_cmp, w_cmp, atol=atol, rtol=rtol)
        if not close.all():
            raise CheckError(f"{what} have the right values, but not the right gradient with respect to {leaf_name} "
                             f"({int((~close).sum())} of {close.numel()} entries differ from the reference's): is part "
                             f"of the computation detached ({_CUT}) or replaced by a constant?")


# --- more than one shape: the shapes the exercise allows, each tried --------------------------


def _sizes(dims: Mapping[str, int]) -> str:
    return f"({', '.join(dims)}) = {tuple(dims.values())}"


def shape_cases(dims: Mapping[str, int], *, ones: tuple[str, ...] = ("B",),
                distinct: Mapping[str, int] | None = None) -> list[tuple[str, dict[str, int], str]]:
    """The shapes to try, as ``(label, sizes, likely cause if only this one fails)``.

    The sizes asked for come first; then each letter of ``ones`` set to 1 (a
    ``squeeze()`` that also drops that axis breaks there); then, if two of the
    sizes asked for are equal, ``distinct``: sizes that all differ, so that a
    transposed or swapped pair of dimensions cannot pass by luck.
    """
    cases = [(_sizes(dims), dict(dims), "")]
    for letter in ones:
        if dims.get(letter, 1) != 1:
            cases.append((f"{letter} = 1", {**dims, letter: 1},
                          f"an axis of size 1 disappeared when {letter} = 1: a `.squeeze()` without a dimension (or "
                          "an index such as [0]) drops every size-1 axis, not only the one you mean"))
    if distinct is not None and len(set(dims.values())) < len(dims):
        cases.append((f"sizes that all differ, {_sizes(distinct)}", dict(distinct),
                      "two sizes that were equal are now different: a transposed or swapped pair of dimensions "
                      "(e.g. T and S) gives the right shape only while they are equal"))
    return cases


def sweep(check_once: Callable[..., None], cases: list[tuple[str, dict[str, Any], str]]) -> None:
    """Run ``check_once(**sizes)`` for every case; a failure after the first case says which case broke it.

    Raises:
        CheckError: The case's own message, prefixed with the shapes that worked and
            the ones that failed, and the likely cause for that case.
    """
    __tracebackhide__ = True  # noqa: F841
    for i, (label, sizes, likely) in enumerate(cases):
        try:
            check_once(**sizes)
        except CheckError as err:
            if i == 0:
                raise
            raise CheckError(f"works for {cases[0][0]} but fails for {label}: {err}"
                             + (f"\n  likely cause: {likely}" if likely else "")) from None
