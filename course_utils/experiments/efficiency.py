"""Attention at scale: cost against sequence length, and tiled attention (notebook 09).

* Vaswani et al. 2017, Table 1: per layer, self-attention costs O(n^2 d)
  operations with O(1) sequential steps; a recurrent layer costs O(n d^2)
  with O(n) sequential steps. ``time_layers`` measures both on this machine.
* The (T, S) weight matrix is the memory wall. Tiled attention with an
  online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022)
  computes the same output one block of keys at a time, never storing it.
  With a causal mask, ``causal_tiled_attention`` skips the tiles above the
  diagonal (block-sparse FlashAttention, Dao et al. 2022, section 3.3) and
  masks only the diagonal tiles (FlashAttention-2, Dao 2023).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.core.errors import InputError


def time_call(fn: Callable[[], Any], repeats: int = 5, min_seconds: float = 0.02, warmup: bool = True) -> float:
    """The fastest of ``repeats`` measurements of ``fn()``'s wall time, in seconds, after one warm-up call (if ``warmup``).

    Each measurement repeats ``fn`` until at least ``min_seconds`` have passed,
    so that very fast calls are not dominated by the timer. The minimum, not
    the mean or median, is kept: another process on the same core can only
    make a measurement slower, so the fastest one is the closest to the cost
    of ``fn`` itself, and it holds still when the machine is busy.
    """
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        times.append(elapsed / calls)
    return min(times)


class SelfAttentionLayer(nn.Module):
    """One head of self-attention of width d with its four projections, W^Q, W^K, W^V and W^O (notebook 09).

    Args:
        d: Width.
        fused: Use PyTorch's fused ``F.scaled_dot_product_attention`` (tiled, never
            storing the (n, n) weights) instead of the course's reference, which
            stores them. Both compute the same function (tests/test_efficiency.py).
    """

    def __init__(self, d: int, fused: bool = False) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, d) -> (B, n, d): 4 n d^2 multiply-adds for the projections, 2 n^2 d for the attention."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (B, n, d) each
        if self.fused:
            context = nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]  # (B, n, d)
        else:
            context = scaled_dot_product_attention(q, k, v)[0]  # (B, n, d)
        return self.out_proj(context)  # (B, n, d)


@dataclass(frozen=True)
class LayerTimes:
    """Measured seconds per forward pass, by sequence length n (see ``time_layers``)."""

    ns: list[int]  # sequence lengths
    d: int  # width
    attention: list[float]  # seconds, self-attention layer with the course's reference attention
    fused: list[float]  # seconds, the same layer with PyTorch's fused attention
    recurrent: list[float]  # seconds, recurrent layer (nn.RNN, tanh)


def time_layers(ns: list[int], d: int, batch_size: int = 1, repeats: int = 5, seed: int = 0,
                with_fused: bool = True) -> LayerTimes:
    """Time a self-attention layer (reference and fused) and a recurrent layer of width d, for each length n.

    Args:
        ns: Sequence lengths.
        d: Width of both layers.
        batch_size: Sequences per forward pass.
        repeats: Rounds over all lengths; each round measures every point once and the
            fastest of the rounds is kept. Interleaving the rounds spreads each point's
            measurements over the whole sweep, so a slow spell of the machine (another
            program, a frequency change) cannot spoil every measurement of one point.
        seed: Seed for the weights and inputs.
        with_fused: Also time the layer with PyTorch's fused attention (else ``fused`` is empty).

    Returns:
        A ``LayerTimes``.
    """
    torch.manual_seed(seed)
    attention, recurrent = SelfAttentionLayer(d).eval(), nn.RNN(d, d, batch_first=True).eval()
    fused = SelfAttentionLayer(d, fused=True).eval()
    fused.load_state_dict(attention.state_dict())
    layers = {"attention": attention, "fused": fused, "recurrent": recurrent}
    if not with_fused:
        del layers["fused"]
    inputs = [torch.randn(batch_size, n, d) for n in ns]
    best = {name: [math.inf] * len(ns) for name in layers}
    with torch.no_grad():
        for x in inputs:  # warm-up: load the kernels and allocate once before measuring
            for layer in layers.values():
                layer(x)
        for _ in range(repeats):  # each round measures every point once, so a slow spell cannot hit all of one point
            for i, x in enumerate(inputs):
                for name, layer in layers.items():
                    best[name][i] = min(best[name][i], time_call(lambda: layer(x), repeats=1, warmup=False))
    t_att, t_fused, t_rnn = best["attention"], best.get("fused", []), best["recurrent"]
    return LayerTimes(ns=list(ns), d=d, attention=t_att, fused=t_fused, recurrent=t_rnn)


def page_faults(fn: Callable[[], Any]) -> int:
    """Minor page faults of one call of ``fn()``, after a first call that loads the kernels (notebook 09).

    A page fault is the first touch of a fresh page of memory: the operating
    system must find the page and fill it with zeros before the program may use
    it. Large tensors are returned to the system when freed (glibc's ``malloc``
    maps them afresh), so a call that allocates a 64 MiB tensor faults in all
    of its 16,384 pages of 4 KiB again on every call. Counted with
    ``resource.getrusage`` (Linux, macOS) or ``GetProcessMemoryInfo`` (Windows).
    """
    fn()
    before = _fault_count()
    fn()
    return _fault_count() - before


def _windows_memory_counters():
    """The process's PROCESS_MEMORY_COUNTERS on Windows (psapi.h): page faults, working set and its peak."""
    import ctypes
    from ctypes import wintypes

    class Counters(ctypes.Structure):  # PROCESS_MEMORY_COUNTERS (psapi.h)
        _fields_ = [("cb", wintypes.DWORD), ("PageFaultCount", wintypes.DWORD)] + [
            (name, ctypes.c_size_t) for name in ("PeakWorkingSetSize", "WorkingSetSize", "QuotaPeakPagedPoolUsage",
                                                 "QuotaPagedPoolUsage", "QuotaPeakNonPagedPoolUsage",
                                                 "QuotaNonPagedPoolUsage", "PagefileUsage", "PeakPagefileUsage")]

    counters = Counters()
    counters.cb = ctypes.sizeof(counters)
    ctypes.windll.psapi.GetProcessMemoryInfo(ctypes.windll.kernel32.GetCurrentProcess(), ctypes.byref(counters),
                                             counters.cb)
    return counters


def _fault_count() -> int:
    if sys.platform == "win32":
        return int(_windows_memory_counters().PageFaultCount)
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block of keys into a running softmax-weighted sum (notebook 09, exercise 1).

    Keeps, per query, the running maximum score m, the running sum of
    exp(score - m) l, and the running sum of exp(score - m) * value acc. When
    a block raises the maximum, the old sums are rescaled by exp(m_old - m_new).
    After the last block, ``acc / l`` is exactly softmax(all scores) @ all values.
    A block whose scores are all -inf (masked) for a row that has no finite score
    yet leaves that row at m = -inf, l = 0, acc = 0 instead of producing NaN.

    Args:
        m: (..., T, 1) running maximum (start: -inf).
        l: (..., T, 1) running denominator (start: 0).
        acc: (..., T, Dv) running numerator (start: 0).
        scores: (..., T, Bk) scores of this block of Bk keys (already scaled).
        v: (..., Bk, Dv) values of this block.

    Returns:
        The updated (m, l, acc), same shapes.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # (..., T, 1)
    shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows with no finite score yet (fully masked): shift by 0
    correction = torch.exp(m - shift)  # (..., T, 1): rescales what was summed with the old maximum
    p = torch.exp(scores - shift)  # (..., T, Bk)
    l_new = l * correction + p.sum(dim=-1, keepdim=True)  # (..., T, 1)
    acc_new = acc * correction + p @ v  # (..., T, Dv) + (..., T, Bk) @ (..., Bk, Dv)
    return m_new, l_new, acc_new


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 256) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dk)) v, one block of keys at a time, without the (T, S) matrix (notebook 09; no mask).

    Only the keys are cut into blocks: every step holds the scores of all T
    queries against one block of keys, (..., T, block_size), so its memory
    grows with T (PyTorch's CPU kernel cuts the queries into blocks as well).

    Args:
        q: (..., T, Dk); k: (..., S, Dk); v: (..., S, Dv), float.
        block_size: Keys per block, C >= 1.

    Returns:
        (..., T, Dv), equal to the naive result up to float rounding.
    """
    if block_size < 1:
        raise InputError(f"block_size must be >= 1, got {block_size}")
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)  # (..., T, 1) running maximum
    l = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype)  # (..., T, 1) running sum of exp(score - m)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (..., T, Dv) running weighted sum of values
    for start in range(0, k.shape[-2], block_size):
        k_block = k[..., start:start + block_size, :]  # (..., C, Dk); the last block may be shorter
        v_block = v[..., start:start + block_size, :]  # (..., C, Dv)
        scores = (q @ k_block.transpose(-2, -1)) * scale  # (..., T, Dk) @ (..., Dk, C) -> (..., T, C)
        m, l, acc = online_softmax_update(m, l, acc, scores, v_block)
    return acc / l  # (..., T, Dv)


def causal_tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           block_size: int) -> tuple[torch.Tensor, int]:
    """Causal self-attention in square tiles, skipping the tiles above the diagonal (notebook 09, exercise 2).

    The T positions are cut into blocks of ``block_size`` (the last one may be
    shorter). Query block i folds in key blocks 0, ..., i with
    ``online_softmax_update``: the blocks before the diagonal whole, the
    diagonal tile with the causal mask inside it (key j is seen by query i only
    if j <= i). The tiles above the diagonal, where every key comes after
    every query, are never computed: G (G + 1) / 2 tiles for G blocks instead
    of G^2 (Dao et al. 2022, section 3.3; only the diagonal tiles are masked,
    as in FlashAttention-2, Dao 2023). Equal to
    ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` up to rounding,
    with no (T, T) tensor, not even the mask.

    Args:
        q: (..., T, Dk) queries; k: (..., T, Dk) keys; v: (..., T, Dv) values
            of the same T positions, float.
        block_size: Positions per block, C >= 1 (any C; C >= T is one tile).

    Returns:
        ``(out, tiles)``: out (..., T, Dv), and the number of (query block,
        key block) tiles computed.

    Raises:
        InputError: If ``block_size`` < 1.
    """
    if block_size < 1:
        raise InputError(f"block_size must be >= 1, got {block_size}")
    T = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs, tiles = [], 0
    for start in range(0, T, block_size):
        q_block = q[..., start:start + block_size, :]  # (..., Cq, Dk); the last block may be shorter
        rows = torch.arange(start, start + q_block.shape[-2])  # (Cq,) positions of these queries
        m = torch.full((*q_block.shape[:-1], 1), float("-inf"), dtype=q.dtype)  # (..., Cq, 1)
        l = torch.zeros((*q_block.shape[:-1], 1), dtype=q.dtype)  # (..., Cq, 1)
        acc = torch.zeros((*q_block.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (..., Cq, Dv)
        for k_start in range(0, start + 1, block_size):  # key blocks at or below the diagonal only
            k_block = k[..., k_start:k_start + block_size, :]  # (..., Ck, Dk)
            v_block = v[..., k_start:k_start + block_size, :]  # (..., Ck, Dv)
            scores = (q_block @ k_block.transpose(-2, -1)) * scale  # (..., Cq, Dk) @ (..., Dk, Ck) -> (..., Cq, Ck)
            if k_start == start:  # the diagonal tile: key j is seen by query i only if j <= i
                cols = torch.arange(k_start, k_start + k_block.shape[-2])  # (Ck,) positions of these keys
                scores = scores.masked_fill(cols[None, :] > rows[:, None], float("-inf"))  # (Cq, Ck) mask
            m, l, acc = online_softmax_update(m, l, acc, scores, v_block)
            tiles += 1
        outs.append(acc / l)  # (..., Cq, Dv)
    return torch.cat(outs, dim=-2), tiles  # (..., T, Dv)


_MEMORY_SCRIPT = r"""
import json, os, re, sys
import torch
from course_utils.blocks.attention import scaled_dot_product_attention
from course_utils.experiments.efficiency import tiled_attention, _windows_memory_counters


def peak_kb():
    if os.path.exists("/proc/self/status"):  # Linux: the high-water mark, reset below
        return int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1))
    if sys.platform == "win32":  # the peak working set; it only grows
        return _windows_memory_counters().PeakWorkingSetSize // 1024
    import resource  # macOS and other Unix systems: the maximum resident set size; it only grows

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)


def current_kb():
    if os.path.exists("/proc/self/status"):
        return int(re.search(r"VmRSS:\s+(\d+) kB", open("/proc/self/status").read()).group(1))
    if sys.platform == "win32":
        return _windows_memory_counters().WorkingSetSize // 1024
    return peak_kb()


kind, d, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ns = [int(n) for n in sys.argv[4:]]
torch.set_num_threads(1)
run = {
    "naive": lambda a, b, c: scaled_dot_product_attention(a, b, c)[0],
    "tiled": lambda a, b, c: tiled_attention(a, b, c, block),
    "pytorch": lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c),
}[kind]
results = []
with torch.no_grad():
    run(*(torch.randn(1, 1, 8, d) for _ in range(3)))  # load the kernels before measuring
    for n in ns:  # buffers this large are returned to the system when freed, so each n starts afresh
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, n, d, generator=g) for _ in range(3))  # (B, H, n, d)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the high-water mark to the current resident size
        except OSError:
            pass
        before = current_kb()
        out = run(q, k, v)
        after = peak_kb()
        results.append({"peak_mb": max(after - before, 0) / 1024, "checksum": float(out.double().sum())})
        del q, k, v, out
print(json.dumps(results))
"""


def peak_memory_curve(kind: str, ns: Sequence[int], d: int, block_size: int = 256) -> list[float]:
    """Extra peak memory (MB) of one attention call on (1, 1, n, d) inputs, for each n, in one fresh process.

    On Linux the process's high-water mark of resident memory is reset just
    before each call (``/proc/self/clear_refs``) and read after it (``VmHWM``);
    on Windows the peak working set (``GetProcessMemoryInfo``), and elsewhere
    the maximum resident set size (``resource.getrusage``); these only grow,
    so give the lengths in increasing order. The
    difference from the resident size before the call is what the call
    needed at its peak.

    Args:
        kind: "naive" (course reference, stores the (n, n) weights), "tiled"
            (``tiled_attention``) or "pytorch" (``F.scaled_dot_product_attention``).
        ns: Sequence lengths, measured in this order.
        d: Width.
        block_size: Keys per block for "tiled".

    Returns:
        Megabytes (MiB), one per length.
    """
    if kind not in ("naive", "tiled", "pytorch"):
        raise InputError(f"kind must be 'naive', 'tiled' or 'pytorch', got {kind!r}")
    result = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, kind, str(d), str(block_size), *map(str, ns)],
                            capture_output=True, text=True, check=True)
    return [float(r["peak_mb"]) for r in json.loads(result.stdout.strip().splitlines()[-1])]


def peak_memory_curves(kinds: Sequence[str], ns: Sequence[int], d: int, block_size: int = 256) -> dict[str, list[float]]:
    """:func:`peak_memory_curve` for several kinds at once, each in its own process, the processes run side by side.

    Each process measures only its own memory, so running them together
    changes no result and saves the start-up time of all but one.

    Returns:
        {kind: megabytes (MiB), one per length}.
    """
    for kind in kinds:
        if kind not in ("naive", "tiled", "pytorch"):
            raise InputError(f"kind must be 'naive', 'tiled' or 'pytorch', got {kind!r}")
    running = {kind: subprocess.Popen([sys.executable, "-c", _MEMORY_SCRIPT, kind, str(d), str(block_size),
                                       *map(str, ns)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for kind in kinds}
    curves = {}
    for kind, process in running.items():
        out, err = process.communicate()
        if process.returncode != 0:
            raise subprocess.CalledProcessError(process.returncode, process.args, out, err)
        curves[kind] = [float(r["peak_mb"]) for r in json.loads(out.strip().splitlines()[-1])]
    return curves


def peak_memory_mb(kind: str, n: int, d: int, block_size: int = 256) -> float:
    """:func:`peak_memory_curve` for one length ``n``: extra peak memory (MB) of one attention call."""
    return peak_memory_curve(kind, [n], d, block_size)[0]
