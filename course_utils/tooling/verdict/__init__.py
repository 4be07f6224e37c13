"""The out-of-kernel verdict: each exercise's checks, run in the grading process on the student's functions.

nbgrader scores a test cell from the outputs of the kernel that the student's
code ran in, and code in a solution cell can change that kernel before the
test cells run: replace a checker or ``torch.allclose``, strip the checker
calls with an IPython input transformer, drop the error messages. This module
computes a second verdict that no code of the student's can reach.

* **The child.** A process in a sandbox like the notebook's kernel's, and in
  the same budget of memory, processes and bytes written
  (:mod:`course_utils.tooling.sandbox`: bubblewrap, only what a notebook needs
  shown, no network, killed at the end; :mod:`.child`; its plan comes in on
  its standard input) runs the notebook's context in
  an IPython shell, in notebook order: the code cells of the ``## Setup``
  section, the cells tagged ``grading-context`` (:data:`CONTEXT_TAG`), and the
  ``## Exercises`` section without its test cells (the solution cells and the
  fallbacks to the reference that follow the tests). The experiments do not
  run. At each test cell's place it keeps the objects that the test cell
  would see. Then it serves requests on a pipe: call a function (or a class,
  or a method of an object it holds) with given arguments, and the
  vector-Jacobian product of tensors it returned
  (``torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)``).
* **The transport.** Tensors and plain values only (None, bool, int, float,
  str, tuples, lists, dicts, sets, NumPy scalars), written with
  ``torch.save`` and read here only with ``torch.load(..., weights_only=True)``
  after the archive itself is checked (stored entries only, bounded sizes).
  Every value is type-checked, a message is at most :data:`MAX_MESSAGE_BYTES`
  and every exercise has a time limit. A child that breaks any of this is
  stopped and the exercise scores 0 with the reason.
* **The checks.** Each test cell of the instructor's notebook, hidden tests
  included, runs here, in the grading process: the names that the solution
  cells define are bound to proxies of the child's objects, every other name
  the cell uses comes from the instructor's imports or definition-only cells.
  A proxy's result is the output of a ``torch.autograd.Function`` whose
  backward asks the child for the vector-Jacobian product, so the course's
  checkers run unchanged, gradients included; a gradient the child does not
  have (it detached) reaches the checker as a cut gradient. A module
  argument (a projection, a layer, a model) goes to the child as a copy whose
  parameters are linked leaves, so gradients reach the checker's parameters
  and nothing the child does to it reaches them; a plain function or lambda
  (a black-box block) stays here and the child calls it back; a
  ``torch.Generator`` goes by its state, and the state it reaches comes back.
  The checks run on one thread, like the kernel after ``setup()``.
* **The score** (:func:`combine`). An exercise keeps nbgrader's points only
  if its checks pass here too; when the kernel said more than this verdict,
  the row is flagged for a human ("in-kernel result disagrees with the
  out-of-kernel check: possible tampering"). A test cell whose last
  expression is a number gets nbgrader's partial credit here as there.

What it does not do: the child is the student's code, so it can still call
the course's reference implementations, which the sandbox shows read-only
(the static flags of :mod:`course_utils.tooling.submissions` and the
checkers' reference guard, which runs in the kernel, cover that only in
part); and a check that relies on state the child does not build (a variable
set by an experiment cell) fails here. Tag the cells such a solution needs
``grading-context``.

The parts: :mod:`.cells` (which cells the child runs, and what each test cell
needs), :mod:`.transport` (the messages and their checks), :mod:`.child` (the
child's server), :mod:`.proxies` (the grading process's end of the pipe and the
autograd node), :mod:`.scoring` (:class:`Judge` and :func:`combine`).
``python -m course_utils.tooling.verdict --coverage notebooks/*.ipynb`` lists
what each exercise checks out of the kernel.
"""

from course_utils.tooling.verdict.cells import CONTEXT_TAG, Check, Plan, plan
from course_utils.tooling.verdict.proxies import ChildFailure, RemoteObject
from course_utils.tooling.verdict.scoring import DISAGREES, Judge, Outcome, combine, coverage, judge
from course_utils.tooling.verdict.transport import MAX_MESSAGE_BYTES, ProtocolError

__all__ = ["CONTEXT_TAG", "Check", "ChildFailure", "DISAGREES", "Judge", "MAX_MESSAGE_BYTES", "Outcome", "Plan",
           "ProtocolError", "RemoteObject", "combine", "coverage", "judge", "plan"]
