"""The pipe between the grading process and the child: tensors and plain values, nothing else.

A message is a dict saved with ``torch.save``: an operation, a tree of tagged
tuples for the value (``("int", 3)``, ``("tuple", [...])``, ``("tensor", i,
requires_grad)``, ...) and the tensors beside it. The grading process reads
the child's messages only with :func:`load`: the archive is checked first
(stored entries only, bounded sizes), then ``torch.load(weights_only=True)``
refuses anything but tensors and plain containers, and :class:`Decoder`
checks every node of the tree.
"""

from __future__ import annotations

import builtins
import io
import struct
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

MAX_MESSAGE_BYTES = 32 * 2**20  # one message from the child
MAX_PICKLE_BYTES = 2**20  # the structure part of a message (tensors aside): unpickled in pure Python
MAX_ENTRIES = 4096  # files in one message's archive (one per tensor)
MAX_DEPTH = 32  # nesting of tuples, lists and dicts
MAX_ITEMS = 100_000  # values in one message
MAX_TEXT = 20_000  # characters of one string
NUMPY_KINDS = "biuf"  # NumPy bool, int, unsigned and float values cross; others stay in the child


class ProtocolError(ValueError):
    """A message that is not what the protocol allows."""


def encode(value: Any, tensor: Callable[[torch.Tensor], tuple], other: Callable[[Any], tuple],
            depth: int = 0) -> tuple:
    """A value as a tree of tagged tuples; ``tensor`` and ``other`` encode what is not a plain value."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"a value nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, np.generic) and value.dtype.kind in NUMPY_KINDS:
        return ("numpy", value.dtype.str, value.item())
    if value is None:
        return ("none",)
    for kind in (bool, int, float, str):  # bool before int; subclasses (IntEnum, str enums) as their base
        if isinstance(value, kind):
            return (kind.__name__, kind(value))
    if isinstance(value, torch.Tensor):
        return tensor(value)
    if isinstance(value, dict):
        return ("dict", [(encode(k, tensor, other, depth + 1), encode(v, tensor, other, depth + 1))
                         for k, v in value.items()])
    for kind in (tuple, list, set, frozenset):
        if isinstance(value, kind):
            return (kind.__name__, [encode(v, tensor, other, depth + 1) for v in value])
    return other(value)


class Decoder:
    """Turns a tree back into values, checking every node: what the child sends is never trusted."""

    def __init__(self, tensor: Callable[[int, bool], Any], handle: Callable[[tuple], Any]):
        self.tensor, self.handle, self.items = tensor, handle, 0

    def __call__(self, node: Any, depth: int = 0) -> Any:
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise ProtocolError(f"more than {MAX_ITEMS} values or {MAX_DEPTH} levels of nesting")
        if not (isinstance(node, tuple) and node and isinstance(node[0], str)):
            raise ProtocolError(f"not a tagged value: {type(node).__name__}")
        tag, args = node[0], node[1:]
        plain = {"none": (), "bool": (bool,), "int": (int,), "float": (float,), "str": (str,)}
        if tag in plain:
            if len(args) != len(plain[tag]) or any(type(a) is not t for a, t in zip(args, plain[tag])):
                raise ProtocolError(f"a malformed {tag}")
            if tag == "str" and len(args[0]) > MAX_TEXT:
                raise ProtocolError(f"a string longer than {MAX_TEXT} characters")
            if tag == "int" and args[0].bit_length() > 4096:
                raise ProtocolError("an integer with more than 4096 bits")
            return args[0] if args else None
        if tag == "numpy":
            if len(args) != 2 or type(args[0]) is not str or len(args[0]) > 8 or type(args[1]) not in (bool, int, float):
                raise ProtocolError("a malformed NumPy value")
            dtype = np.dtype(args[0])
            if dtype.kind not in NUMPY_KINDS:
                raise ProtocolError(f"a NumPy value of dtype {dtype}")
            return dtype.type(args[1])
        if tag == "tensor":
            if len(args) != 2 or type(args[0]) is not int or type(args[1]) is not bool:
                raise ProtocolError("a malformed tensor reference")
            return self.tensor(*args)
        if tag in ("tuple", "list", "set", "frozenset"):
            if len(args) != 1 or type(args[0]) is not list:
                raise ProtocolError(f"a malformed {tag}")
            items = [self(item, depth + 1) for item in args[0]]
            try:
                return {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[tag](items)
            except TypeError as exc:  # an unhashable member of a set
                raise ProtocolError(f"a malformed {tag}: {exc}") from None
        if tag == "dict":
            if len(args) != 1 or type(args[0]) is not list:
                raise ProtocolError("a malformed dict")
            out = {}
            for pair in args[0]:
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise ProtocolError("a malformed dict entry")
                try:
                    out[self(pair[0], depth + 1)] = self(pair[1], depth + 1)
                except TypeError as exc:
                    raise ProtocolError(f"a malformed dict key: {exc}") from None
            return out
        if tag in ("handle", "callback", "object", "generator"):
            return self.handle(node)
        raise ProtocolError(f"an unknown kind of value {tag[:40]!r}")


def pack(message: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    data = buffer.getvalue()
    return struct.pack(">Q", len(data)) + data


def check_archive(data: bytes) -> None:
    """Refuse an archive that could cost more to open than its size says (compressed, a huge pickle)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ProtocolError(f"not a torch.save archive ({exc})") from None
    if len(entries) > MAX_ENTRIES:
        raise ProtocolError(f"{len(entries)} files in one message, over the limit of {MAX_ENTRIES}")
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.file_size != entry.compress_size:
            raise ProtocolError(f"a compressed entry ({entry.filename[:60]})")
        if entry.filename.endswith(".pkl") and entry.file_size > MAX_PICKLE_BYTES:
            raise ProtocolError(f"a structure of {entry.file_size} bytes, over {MAX_PICKLE_BYTES}")
    if sum(e.file_size for e in entries) > MAX_MESSAGE_BYTES:
        raise ProtocolError("an archive larger than its message")


def load(data: bytes) -> dict:
    """A message from the child: only tensors and plain containers, never pickled code."""
    check_archive(data)
    try:
        message = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - the weights-only unpickler refuses in several ways
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = next((line for line in lines if "unsupported" in line.lower()), lines[-1] if lines else type(exc).__name__)
        raise ProtocolError(f"torch.load(weights_only=True) refused it: {why[:160]}") from None
    if not (isinstance(message, dict) and isinstance(message.get("op"), str)):
        raise ProtocolError("a message without an operation")
    tensors = message.get("tensors", [])
    ids = message.get("ids", [])
    if not (isinstance(tensors, list) and isinstance(ids, list) and len(ids) in (0, len(tensors))):
        raise ProtocolError("malformed tensors")
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor or t.layout != torch.strided or t.device.type != "cpu" or t.is_quantized:
            raise ProtocolError(f"a value that is not a plain CPU tensor ({type(t).__name__})")
        if t.numel() * t.element_size() > t.untyped_storage().nbytes():  # e.g. stride 0: huge once copied
            raise ProtocolError(f"a tensor of shape {tuple(t.shape)[:8]} whose elements overlap in memory")
    if any(type(i) is not int for i in ids):
        raise ProtocolError("malformed tensor ids")
    return message


def exception_named(type_name: str, message: str) -> Exception:
    """An exception of the same name as the child's (a builtin one when it is one)."""
    cls = getattr(builtins, type_name, None) if type_name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        name = type_name if type_name.isidentifier() and len(type_name) <= 60 else "ChildError"
        cls = type(name, (Exception,), {"__module__": "grading child"})
    try:
        return cls(message)
    except Exception:  # noqa: BLE001 - a builtin exception with another signature
        return RuntimeError(f"{type_name}: {message}")


class Slot:
    """Where a tensor goes in a decoded value (filled in once the autograd node exists)."""

    def __init__(self, index: int):
        self.index = index


def replace_tensors(shape: Any, values: dict[int, torch.Tensor]) -> Any:
    """Put the tensors into a decoded value, in place of its ``Slot`` placeholders."""
    if isinstance(shape, Slot):
        return values[shape.index]
    if isinstance(shape, (list, tuple, set, frozenset)):
        items = [replace_tensors(v, values) for v in shape]
        return type(shape)(items) if not isinstance(shape, tuple) else tuple(items)
    if isinstance(shape, dict):
        return {replace_tensors(k, values): replace_tensors(v, values) for k, v in shape.items()}
    return shape
