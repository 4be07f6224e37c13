"""The child: inside the sandbox, runs the notebook's context, then serves the grading process's requests.

Started as ``python -m course_utils.tooling.verdict.child --in-fd N --out-fd M`` (the plan on stdin)
by :class:`course_utils.tooling.verdict.proxies.Child`. Everything here runs
beside the student's code and is trusted by nobody: the grading process checks
all it receives (:mod:`course_utils.tooling.verdict.transport`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from course_utils.tooling.verdict.transport import Decoder, encode, exception_named, pack

_CHILD_IDS = 1 << 40  # tensor and object ids below: made by the grading process; from here on: by the child

_SERVER = None  # the child's server (a module global, so that nothing else needs to hold it)


class _Server:
    """The child's side of the pipe: runs the requests of the grading process on the student's objects."""

    def __init__(self, in_fd: int, out_fd: int):
        self.reader = os.fdopen(in_fd, "rb", buffering=0)
        self.out_fd = out_fd
        self.tensors: dict[int, torch.Tensor] = {}
        self.objects: dict[int, Any] = {}
        self.exports: dict[str, dict[str, Any]] = {}
        self.undefined: dict[str, dict[str, str]] = {}
        self.generators: list[tuple[int, torch.Generator]] = []  # the generators of the request being decoded
        self.next_id = _CHILD_IDS

    # -- messages
    def send(self, message: dict) -> None:
        data = pack(message)
        view = memoryview(data)
        while view:
            view = view[os.write(self.out_fd, view):]

    def receive(self) -> dict:
        header = self._read(8)
        (size,) = struct.unpack(">Q", header)
        # the grading process is trusted here: its messages may hold pickled objects (modules, by value)
        return torch.load(io.BytesIO(self._read(size)), weights_only=False)

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.reader.read(min(left, 2**20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # -- values
    def encode(self, value: Any) -> dict:
        tensors: list[torch.Tensor] = []
        ids: list[int] = []

        def tensor(t: torch.Tensor) -> tuple:
            try:
                plain = t.detach().resolve_conj().resolve_neg()
                plain = (plain.to_dense() if plain.layout != torch.strided else plain).as_subclass(torch.Tensor)
                plain = plain.clone()
            except Exception:  # noqa: BLE001 - a tensor that cannot be copied stays here, as an object
                return other(t)
            uid = self._new_id()
            self.tensors[uid] = t
            tensors.append(plain)
            ids.append(uid)
            return ("tensor", len(tensors) - 1, bool(t.requires_grad))

        def other(obj: Any) -> tuple:
            uid = self._new_id()
            self.objects[uid] = obj
            return ("handle", uid, callable(obj), type(obj).__name__[:80])

        return {"tree": encode(value, tensor, other), "tensors": tensors, "ids": ids}

    def decode(self, message: dict) -> Any:
        tensors, ids, objects = message.get("tensors", []), message.get("ids", []), message.get("objects", [])
        made: dict[int, torch.Tensor] = {}
        self.generators = []

        def tensor(index: int, requires_grad: bool, parameter: bool = False) -> torch.Tensor:
            if index not in made:
                t = tensors[index]
                if parameter:
                    t = torch.nn.Parameter(t, requires_grad=requires_grad)
                elif requires_grad and (t.is_floating_point() or t.is_complex()):
                    t.requires_grad_(True)
                made[index] = t
                self.tensors[ids[index]] = t
            return made[index]

        def handle(node: tuple) -> Any:
            if node[0] == "callback":
                return self._stub(node[1])
            if node[0] == "object":  # a copy; its tensors that need a gradient are this message's leaves
                unpickler = pickle.Unpickler(io.BytesIO(objects[node[1]]))
                unpickler.persistent_load = lambda pid: tensor(pid[1], True, pid[2])
                return unpickler.load()
            if node[0] == "generator":
                generator = torch.Generator()
                generator.set_state(tensors[node[1]])
                self.generators.append((node[1], generator))
                return generator
            return self.objects[node[1]]

        return Decoder(tensor, handle)(message["tree"])

    def _stub(self, cid: int) -> Callable[..., Any]:
        """A callable of the grading process's, which the student's code calls through the pipe."""
        def call_back(*args: Any, **kwargs: Any) -> Any:
            self.send({"op": "callback", "cid": cid, **self.encode((list(args), kwargs))})
            reply = self.serve(until=("callback_result", "callback_error"))
            if reply["op"] == "callback_error":
                raise exception_named(reply.get("type", "RuntimeError"), reply.get("message", ""))
            return self.decode(reply)

        call_back.__name__ = f"grader_callable_{cid}"
        return call_back

    # -- requests
    def serve(self, until: tuple[str, ...] = ()) -> dict | None:
        while True:
            try:
                message = self.receive()
            except EOFError:
                if until:
                    raise
                return None
            if message["op"] in until:
                return message
            self.send(self.dispatch(message))

    def dispatch(self, message: dict) -> dict:
        op = message["op"]
        try:
            if op == "exports":
                exercise = message["exercise"]
                found = self.exports.get(exercise, {})
                return {"op": "result", **self.encode({"objects": found,
                                                       "undefined": self.undefined.get(exercise, {})})}
            if op == "call":
                return self._call(message)
            if op == "vjp":
                return self._vjp(message)
            if op == "reset":
                self.tensors.clear()
                self.objects.clear()
                return {"op": "result", **self.encode(None)}
            return {"op": "error", "type": "ProtocolError", "message": f"unknown request {op!r}", "where": ""}
        except BaseException as exc:  # noqa: BLE001 - the student's code may raise anything, SystemExit included
            if isinstance(exc, EOFError):
                raise
            return {"op": "error", "type": type(exc).__name__, "message": str(exc)[:2000], "where": _where(exc)}

    def _call(self, message: dict) -> dict:
        kind, *rest = message["target"]
        if kind == "export":
            fn = self.exports[rest[0]][rest[1]]
        elif kind == "handle":
            fn = self.objects[rest[0]]
        else:  # a method of an object the child holds
            fn = getattr(self.objects[rest[0]], rest[1])
        args, kwargs = self.decode(message)
        generators = self.generators
        before = {uid: self.tensors[uid].detach().clone() for uid in set(message.get("ids", []))
                  if uid in self.tensors}
        with torch.set_grad_enabled(bool(message.get("grad"))):
            result = fn(*args, **kwargs)
        changed = [(uid, self.tensors[uid]) for uid, old in before.items()
                   if not (old.shape == self.tensors[uid].shape and torch.equal(old, self.tensors[uid].detach()))]
        drawn = [(index, generator.get_state()) for index, generator in generators]  # where each generator is now
        return {"op": "result", **self.encode((result, changed, drawn))}

    def _vjp(self, message: dict) -> dict:
        outputs = [self.tensors[i] for i in message["outputs"]]
        inputs = [self.tensors[i] for i in message["inputs"]]
        grads = self.decode(message)
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
        result: list[torch.Tensor | None] = [None] * len(inputs)
        if pairs and wanted:
            found = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted], [g for _, g in pairs],
                                        allow_unused=True, retain_graph=True)
            for i, g in zip(wanted, found):
                result[i] = g
        return {"op": "result", **self.encode(result)}


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        name = frame.filename.replace("\\", "/")
        if "/course_utils/" in name or "/site-packages/" in name or "/lib/python" in name:
            continue
        code = (frame.line or "").strip()
        return f"line {frame.lineno} of {frame.name}(): `{code[:120]}`"
    return ""


def serve(in_fd: int, out_fd: int) -> int:
    """Inside the sandbox: run the notebook's context (its plan on stdin), keep what each test cell would see, serve."""
    global _SERVER
    from course_utils.tooling.notebook_runner import read_stdin

    os.set_inheritable(in_fd, False)
    os.set_inheritable(out_fd, False)
    os.environ["MPLBACKEND"] = "Agg"
    steps = json.loads(read_stdin().decode("utf-8"))  # nothing of the run's input is on disk for the student's code
    server = _SERVER = _Server(in_fd, out_fd)
    torch.set_num_threads(1)
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    errors: list[tuple[int, str]] = []
    theirs: set[str] = set()  # names that a solution cell bound, and nothing rebound since
    unset = object()
    for step in steps:
        ns = shell.user_ns
        if "snapshot" in step:
            server.exports[step["snapshot"]] = {n: ns[n] for n in step["names"] if n in ns and n in theirs}
            server.undefined[step["snapshot"]] = {n: "" for n in step["names"] if n not in theirs}
            continue
        before = {n: ns.get(n, unset) for n in step["solution"] or theirs}
        result = shell.run_cell(step["source"], store_history=False)
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            errors.append((step["cell"], f"{type(error).__name__}: {str(error)[:300]}"))
        changed = {n for n, old in before.items() if shell.user_ns.get(n, unset) is not old}
        # a solution cell makes the names it (re)binds the student's; any other cell (a fallback) takes them back
        theirs = theirs | changed if step["solution"] else theirs - changed
    server.send({"op": "ready", **server.encode(errors)})
    server.serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(inside the sandbox) the child of the out-of-kernel verdict; "
                                                 "reads its plan (JSON) on stdin")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(args.in_fd, args.out_fd)


if __name__ == "__main__":
    # Run as the imported module, not as __main__ (which the child's IPython shell takes over).
    from course_utils.tooling.verdict import child

    sys.exit(child.main())
