"""The grading process's end: the sandboxed child, and proxies of its objects that autograd can run through."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from course_utils.tooling import sandbox
from course_utils.tooling.verdict.transport import (MAX_MESSAGE_BYTES, Decoder, ProtocolError, Slot, encode,
                                                    exception_named, load, pack, replace_tensors)

MAX_CALLBACK_ELEMENTS = 2**16  # numbers the child may hand to one of the grader's callables
MAX_CALLBACKS = 10_000  # calls back per request


class ChildFailure(BaseException):
    """The child hung, died, or sent what it must not: it was stopped; the message says why.

    A ``BaseException``, so that a checker's ``except Exception`` (which turns a
    student's error into a message) does not swallow it.
    """


class _Link:
    """What a proxy's autograd node needs to ask the child for a vector-Jacobian product."""

    def __init__(self, child: Child, outputs: list[int], inputs: list[tuple[torch.Tensor, int]],
                 values: list[torch.Tensor]):
        self.child, self.outputs, self.inputs, self.values = child, outputs, inputs, values


class _ChildGraph(torch.autograd.Function):
    """Tensors the child computed: forward gives its values, backward asks it for the vector-Jacobian product."""

    @staticmethod
    def forward(ctx, link: _Link, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: ARG004
        ctx.link = link
        return tuple(v.clone() for v in link.values)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (None, *ctx.link.child.vjp(ctx.link, grads))


class RemoteObject:
    """An object that stays in the child (what cannot cross the pipe): call it, or call its methods."""

    def __init__(self, child: Child, uid: int, is_callable: bool, type_name: str):
        self._child, self._uid, self._callable, self._type = child, uid, is_callable, type_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._callable:
            raise TypeError(f"'{self._type}' object (in the grading child) is not callable")
        return self._child.call(("handle", self._uid), args, kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        return proxy(self._child, ("method", self._uid, name), name)

    def __repr__(self) -> str:
        return f"<{self._type} object in the grading child>"


def proxy(child: Child, target: tuple, name: str) -> Callable[..., Any]:
    """A plain function standing for one of the child's callables (``__name__`` and ``__code__`` like any)."""
    def proxy(*args: Any, **kwargs: Any) -> Any:
        return child.call(target, args, kwargs)

    proxy.__name__ = proxy.__qualname__ = name
    return proxy


class _Outgoing:
    """Encodes values for the child.

    Tensors go by value; a module (or its bound method) and any other object
    that is not a plain function goes by value too, pickled (only the child
    unpickles), with each of its tensors that needs a gradient sent as a leaf
    of this message, so that gradients reach the grader's parameters; a
    generator goes by its state (the state it reaches comes back); other
    callables stay here and the child calls them back; the child's own
    objects go by id.
    """

    def __init__(self, child: Child):
        self.child = child
        self.tensors: list[torch.Tensor] = []
        self.ids: list[int] = []
        self.index: dict[int, int] = {}
        self.sent: dict[int, torch.Tensor] = {}  # id -> the grader's tensor
        self.leaves: list[tuple[torch.Tensor, int]] = []
        self.objects: list[bytes] = []
        self.generators: dict[int, torch.Generator] = {}  # index of its state among the tensors -> generator

    def encode(self, value: Any) -> tuple:
        return encode(value, self._tensor, self._other)

    def message(self, **fields: Any) -> dict:
        return {**fields, "tensors": self.tensors, "ids": self.ids, "objects": self.objects}

    def _pickle(self, obj: Any) -> int:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)

        def persistent_id(value: Any) -> tuple | None:
            if isinstance(value, torch.Tensor) and torch.is_grad_enabled() and value.requires_grad:
                _, index, _ = self._tensor(value)
                return ("leaf", index, isinstance(value, torch.nn.Parameter))
            return None

        pickler.persistent_id = persistent_id
        pickler.dump(obj)
        self.objects.append(buffer.getvalue())
        return len(self.objects) - 1

    def _tensor(self, t: torch.Tensor) -> tuple:
        grad = torch.is_grad_enabled() and t.requires_grad
        if id(t) not in self.index:
            uid = self.child.new_id()
            self.index[id(t)] = len(self.tensors)
            self.tensors.append(t.detach().clone())
            self.ids.append(uid)
            self.sent[uid] = t
            if grad:
                self.leaves.append((t, uid))
        return ("tensor", self.index[id(t)], grad)

    def _other(self, obj: Any) -> tuple:
        if isinstance(obj, RemoteObject) and obj._child is self.child:
            return ("handle", obj._uid, obj._callable, obj._type)
        if isinstance(obj, torch.Generator):
            _, index, _ = self._tensor(obj.get_state())
            self.generators[index] = obj
            return ("generator", index)
        module = isinstance(obj, torch.nn.Module) or isinstance(getattr(obj, "__self__", None), torch.nn.Module)
        if module or not callable(obj):
            try:
                return ("object", self._pickle(obj))
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                if not callable(obj):
                    raise TypeError(f"the out-of-kernel check cannot send a {type(obj).__name__} to the grading "
                                    f"child: it cannot be copied ({exc})") from None
        return ("callback", self.child.register(obj))


class Child:
    """The sandboxed child process and the grading process's end of its pipes."""

    def __init__(self, steps: tuple[dict, ...], hide: list[Path], limits: sandbox.Limits, budget: sandbox.Budget):
        """Start the child in a sandbox held to ``budget`` (shared with the notebook's kernel).

        Raises:
            sandbox.BudgetExceeded: If the budget was already exceeded (nothing is started).
        """
        self.timeout_note = ""
        self.deadline = time.monotonic()
        self.callbacks: dict[int, Callable[..., Any]] = {}
        self.next_id = 0
        self.next_callback = 0
        self.alive = True
        self.errors: dict[int, str] = {}
        self.ready = False
        self.budget = budget
        to_child, self._from_grader = os.pipe()
        self._from_child, to_grader = os.pipe()
        argv = [sys.executable, "-m", "course_utils.tooling.verdict.child", "--in-fd", str(to_child),
                "--out-fd", str(to_grader)]
        try:
            self.process = budget.popen(sandbox.sandbox_command(argv, hide, limits), pass_fds=(to_child, to_grader),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except BaseException:
            for fd in (self._from_grader, self._from_child):
                os.close(fd)
            raise
        finally:
            os.close(to_child)
            os.close(to_grader)
        os.set_blocking(self._from_grader, False)
        weakref.finalize(self, _stop, self.process)  # stopped even if nobody calls kill()
        # The plan goes in on its standard input (nothing of it is on disk for the student's code).
        threading.Thread(target=_feed, args=(self.process.stdin, json.dumps(list(steps)).encode()),
                         daemon=True).start()
        self._log: collections.deque[bytes] = collections.deque(maxlen=16)  # the last 64 KB it printed
        self._drain = threading.Thread(target=self._drain_log, daemon=True)
        self._drain.start()

    def _drain_log(self) -> None:
        for chunk in iter(lambda: self.process.stdout.read1(4096), b""):
            self._log.append(chunk)

    def log_tail(self, lines: int = 3) -> str:
        text = b"".join(self._log).decode(errors="replace").strip().splitlines()[-lines:]
        return " | ".join(line.strip()[-300:] for line in text) or "none"

    def kill(self, grace: float = 0.0) -> None:
        """Stop the child: after ``grace`` seconds to end by itself on end-of-input, by force."""
        if self.alive:
            self.alive = False
            os.close(self._from_grader)  # end of input: a child that behaves ends now
            if grace:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=grace)
            _stop(self.process)  # the sandbox's processes, daemons included, end with it
            os.close(self._from_child)
            self._drain.join(timeout=5)
            self.process.stdout.close()

    def fail(self, reason: str) -> ChildFailure:
        self.kill()
        return ChildFailure(reason)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def register(self, fn: Callable[..., Any]) -> int:
        self.next_callback += 1
        self.callbacks[self.next_callback] = fn
        return self.next_callback

    # -- the pipe
    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.fail(f"the grading child did not answer within the time limit and was stopped"
                            f"{self.timeout_note}")
        return left

    def send(self, message: dict) -> None:
        if not self.alive:
            raise ChildFailure("the grading child was already stopped")
        view = memoryview(pack(message))
        while view:
            _, writable, _ = select.select([], [self._from_grader], [], self._left())
            if not writable:
                continue
            try:
                view = view[os.write(self._from_grader, view):]
            except BlockingIOError:
                continue
            except OSError:  # the child is gone (broken pipe)
                raise self._died() from None

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            readable, _, _ = select.select([self._from_child], [], [], self._left())
            if not readable:
                continue
            chunk = os.read(self._from_child, min(left, 2**20))
            if not chunk:
                raise self._died()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _died(self) -> ChildFailure:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2)
        code = self.process.returncode
        self._drain.join(timeout=2)
        if self.budget.check():  # the student's sandboxes went over their budget, and were all stopped
            return self.fail(self.budget.breach)
        return self.fail(f"the grading child stopped (exit code {code}: it exited, or hit the memory or process "
                         f"limit); its last output: {self.log_tail()}")

    def receive(self) -> dict:
        if not self.alive:
            raise ChildFailure("the grading child was already stopped")
        (size,) = struct.unpack(">Q", self._read(8))
        if size > MAX_MESSAGE_BYTES:
            raise self.fail(f"the grading child sent a message of {size / 2**20:.0f} MB, over the "
                            f"{MAX_MESSAGE_BYTES // 2**20} MB limit, and was stopped (a huge tensor?)")
        try:
            return load(self._read(size))
        except ProtocolError as exc:
            raise self.fail(f"the grading child sent something other than tensors and plain values ({exc}) "
                            "and was stopped") from None

    # -- requests
    def wait_ready(self, deadline: float) -> None:
        if self.ready:
            return
        self.deadline = deadline
        self.timeout_note = " while it ran the notebook's setup and solution cells (a loop that never ends?)"
        message = self.receive()
        if message["op"] != "ready":
            raise self.fail(f"the grading child sent {message['op'][:40]!r} before it was ready, and was stopped")
        errors = self._decode(message, [])
        if not (isinstance(errors, list) and all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], int)
                                                  and isinstance(e[1], str) for e in errors)):
            raise self.fail("the grading child sent a malformed list of errors and was stopped")
        self.errors = dict(errors)
        self.ready = True
        self.timeout_note = ""

    def request(self, message: dict, leaves: list[tuple[torch.Tensor, int]] | None = None,
                grad: bool = False) -> Any:
        """Send a request; answer the child's callbacks until its reply; the reply's value."""
        self.send(message)
        calls = 0
        while True:
            reply = self.receive()
            op = reply["op"]
            if op == "result":
                return self._decode(reply, leaves if leaves is not None else [], grad)
            if op == "error":
                fields = [reply.get(k) for k in ("type", "message", "where")]
                if not all(isinstance(f, str) for f in fields):
                    raise self.fail("the grading child sent a malformed error and was stopped")
                type_name, text, where = fields
                raise exception_named(type_name[:60], text[:2000] + (f" (at {where[:200]})" if where else ""))
            if op == "callback" and leaves is not None:
                calls += 1
                if calls > MAX_CALLBACKS:
                    raise self.fail(f"the grading child called back more than {MAX_CALLBACKS} times in one "
                                    "request and was stopped")
                self._call_back(reply, leaves, grad)
                continue
            raise self.fail(f"the grading child sent an unexpected {op[:40]!r} and was stopped")

    def _call_back(self, message: dict, leaves: list[tuple[torch.Tensor, int]], grad: bool) -> None:
        fn = self.callbacks.get(message.get("cid")) if type(message.get("cid")) is int else None
        if fn is None:
            raise self.fail("the grading child called back something it was not given, and was stopped")
        tensors = message.get("tensors", [])
        if sum(t.numel() for t in tensors if t is not None) > MAX_CALLBACK_ELEMENTS:
            raise self.fail(f"the grading child passed more than {MAX_CALLBACK_ELEMENTS} numbers to one of the "
                            "grader's callables and was stopped")
        decoded = self._decode(message, leaves, grad, objects=False)  # the grader's code gets no object of theirs
        if not (isinstance(decoded, tuple) and len(decoded) == 2 and isinstance(decoded[0], list)
                and isinstance(decoded[1], dict) and all(isinstance(k, str) for k in decoded[1])):
            raise self.fail("the grading child sent malformed arguments and was stopped")
        args, kwargs = decoded
        try:
            with torch.set_grad_enabled(grad):
                result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the callable's error goes back to the student's code
            self.send({"op": "callback_error", "type": type(exc).__name__, "message": str(exc)[:2000]})
            return
        out = _Outgoing(self)
        tree = out.encode(result)
        leaves.extend(out.leaves)
        self.send(out.message(op="callback_result", tree=tree))

    def _decode(self, message: dict, leaves: list[tuple[torch.Tensor, int]], grad: bool = False,
                objects: bool = True) -> Any:
        """A reply's value: its tensors that need a gradient are tied to ``leaves`` through the child.

        ``objects=False`` refuses references to the child's objects (arguments for the grader's callables).
        """
        tensors, ids = message.get("tensors", []), message.get("ids", [])
        if len(ids) != len(tensors):
            raise self.fail("the grading child sent tensors without ids and was stopped")
        attach: dict[int, int] = {}  # tensor index -> position among the outputs of the autograd node

        def tensor(index: int, requires_grad: bool) -> Any:
            if not 0 <= index < len(tensors) or tensors[index] is None:
                raise ProtocolError("a reference to a missing tensor")
            differentiable = tensors[index].is_floating_point() or tensors[index].is_complex()
            if requires_grad and grad and differentiable and leaves and index not in attach:
                attach[index] = len(attach)
            return Slot(index)

        def handle(node: tuple) -> Any:
            if node[0] != "handle" or len(node) != 4 or type(node[1]) is not int or type(node[2]) is not bool \
                    or type(node[3]) is not str:
                raise ProtocolError("a malformed object reference")
            if not objects:
                raise ProtocolError(f"a {node[3][:40]} object passed to one of the grader's callables")
            return RemoteObject(self, node[1], node[2], node[3][:80])

        try:
            shape = Decoder(tensor, handle)(message.get("tree"))
        except Exception as exc:  # noqa: BLE001 - whatever a malformed tree raises
            raise self.fail(f"the grading child sent something other than tensors and plain values ({exc}) "
                            "and was stopped") from None
        values = {i: t.detach().clone() for i, t in enumerate(tensors) if t is not None}
        if attach:
            order = sorted(attach, key=attach.get)
            link = _Link(self, [ids[i] for i in order], list(leaves), [values[i] for i in order])
            outputs = _ChildGraph.apply(link, *[t for t, _ in leaves])
            for i, out in zip(order, outputs):
                values[i] = out
        return replace_tensors(shape, values)

    # -- what the proxies call
    def exports(self, exercise: str) -> tuple[dict[str, Any], set[str]]:
        found = self.request({"op": "exports", "exercise": exercise})
        if not (isinstance(found, dict) and isinstance(found.get("objects"), dict)
                and isinstance(found.get("undefined"), dict)):
            raise self.fail("the grading child sent a malformed list of names and was stopped")
        return found["objects"], set(found["undefined"])

    def call(self, target: tuple, args: tuple, kwargs: dict) -> Any:
        grad = torch.is_grad_enabled()
        out = _Outgoing(self)
        tree = out.encode((list(args), dict(kwargs)))
        leaves = list(out.leaves)
        first_callback = self.next_callback
        try:
            reply = self.request(out.message(op="call", target=target, grad=grad, tree=tree), leaves, grad)
        finally:
            for cid in range(first_callback + 1, self.next_callback + 1):
                self.callbacks.pop(cid, None)
        if not (isinstance(reply, tuple) and len(reply) == 3 and isinstance(reply[1], list)
                and isinstance(reply[2], list)):
            raise self.fail("the grading child sent a malformed result and was stopped")
        result, changed, drawn = reply
        for item in drawn:  # a generator the student's function drew from: here it is where it got to there
            generator = out.generators.get(item[0]) if isinstance(item, tuple) and len(item) == 2 else None
            state = item[1] if generator is not None else None
            if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8
                    and state.shape == generator.get_state().shape):
                raise self.fail("the grading child sent a malformed generator state and was stopped")
            generator.set_state(state)
        for item in changed:  # the student's function changed an argument in place: so it did here
            if not (isinstance(item, tuple) and len(item) == 2 and type(item[0]) is int
                    and isinstance(item[1], torch.Tensor)):
                raise self.fail("the grading child sent a malformed result and was stopped")
            original = out.sent.get(item[0])
            if original is not None and original.shape == item[1].shape:
                with torch.no_grad():
                    original.copy_(item[1].to(original.dtype))
        return result

    def vjp(self, link: _Link, grads: tuple[torch.Tensor, ...]) -> list[torch.Tensor | None]:
        if link.child is not self or not self.alive:
            raise ChildFailure("a gradient was asked of a grading child that was already stopped")
        out = _Outgoing(self)
        with torch.no_grad():
            tree = out.encode([g for g in grads])
        found = self.request(out.message(op="vjp", outputs=link.outputs, inputs=[uid for _, uid in link.inputs],
                                         tree=tree))
        if not (isinstance(found, list) and len(found) == len(link.inputs)):
            raise self.fail("the grading child sent a malformed gradient and was stopped")
        result = []
        for grad, (leaf, _) in zip(found, link.inputs):
            if grad is not None and not (isinstance(grad, torch.Tensor) and grad.shape == leaf.shape):
                raise self.fail(f"the grading child sent a gradient of shape {getattr(grad, 'shape', None)} for an "
                                f"input of shape {tuple(leaf.shape)}, and was stopped")
            result.append(None if grad is None else grad.to(leaf.dtype))
        return result

    def reset(self) -> None:
        if self.alive:
            self.request({"op": "reset"})


def _feed(pipe, data: bytes) -> None:
    """Write ``data`` to a child's standard input and close it (a child that died early reads nothing)."""
    with contextlib.suppress(OSError):
        with pipe:
            pipe.write(data)


def _stop(process: subprocess.Popen) -> None:
    """Kill the sandbox's process group (all the child started), unless it has already been reaped."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
