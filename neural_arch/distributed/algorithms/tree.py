"""Binomial-tree rooted collectives: broadcast, reduce, gather and scatter.

Ranks are renumbered relative to the root (``vrank = (rank - root) % n``). The parent of
``vrank`` is ``vrank`` minus its lowest set bit; its subtree covers the ``span`` consecutive
vranks starting at itself. Each takes ceil(log2 n) rounds instead of n - 1.
"""
from __future__ import annotations

import numpy as np

from ..reduce_ops import ReduceOp, combiner
from ..scratch import thread_scratch
from ..transports.base import Fingerprint, Transport
from .exchange import recv, segment_elems, send


def _lowbit(vrank: int) -> int:
    return vrank & -vrank


def _top_mask(n: int) -> int:
    """Smallest power of two >= n: the root's "lowest bit" for the tree arithmetic."""
    return 1 << max(0, (n - 1).bit_length())


def _span(vrank: int, n: int) -> int:
    return n if vrank == 0 else min(_lowbit(vrank), n - vrank)


def _real(vrank: int, root: int, n: int) -> int:
    return (vrank + root) % n


def _check_root(t: Transport, root: int) -> None:
    if not 0 <= root < t.world_size:
        raise ValueError(f"root rank {root} is out of range for world size {t.world_size}")


def _root_relative_rank(t: Transport, root: int, whole: np.ndarray | None, m: int,
                        need: str) -> int:
    """This rank's place counted from ``root`` (0: the root), once ``root`` is a rank and, on
    the root, ``whole`` holds the world's ``m`` elements per rank (ValueError: ``need`` of
    n x m elements, got what)."""
    _check_root(t, root)
    n = t.world_size
    vrank = (t.rank - root) % n
    if vrank == 0:
        check_whole(whole, n, m, need)
    return vrank


def check_whole(whole: np.ndarray | None, n: int, m: int, need: str) -> None:
    """ValueError unless the root's ``whole`` holds ``n`` x ``m`` elements (``need``: what
    the message says is needed, e.g. "gather root needs an output")."""
    if whole is None or whole.size != n * m:
        got = None if whole is None else whole.size
        raise ValueError(f"{need} of {n} x {m} = {n * m} elements, got {got}")


def broadcast(t: Transport, buf: np.ndarray, root: int, fp: Fingerprint) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank, pipelined segment by segment."""
    _check_root(t, root)
    n = t.world_size
    if n == 1 or buf.size == 0:
        return
    vrank = (t.rank - root) % n
    top = _lowbit(vrank) if vrank else _top_mask(n)
    seg = segment_elems(buf.itemsize)
    for lo in range(0, buf.size, seg):
        piece = buf[lo:lo + seg]
        if vrank:
            recv(t, piece, _real(vrank - top, root, n), fp)
        mask = top >> 1
        while mask:
            if vrank + mask < n:
                send(t, piece, _real(vrank + mask, root, n), fp)
            mask >>= 1


def reduce(t: Transport, buf: np.ndarray, root: int, op: ReduceOp, fp: Fingerprint) -> None:
    """Reduce every rank's ``buf`` into ``buf`` of ``root``; other ranks' buffers are unchanged."""
    _check_root(t, root)
    n = t.world_size
    if n == 1 or buf.size == 0:
        return
    vrank = (t.rank - root) % n
    combine = combiner(op, buf.dtype)
    has_children = vrank % 2 == 0 and vrank + 1 < n
    seg = segment_elems(buf.itemsize)
    span = min(seg, buf.size)
    # A rank with children receives a segment at a time into this thread's scratch, and one
    # that is not the root folds them into a copy of its own segment there, so its buffer
    # stays as it was: at most two segments, kept between calls (a new buffer of several MiB
    # costs a page fault per 4 KiB on every call, ``scratch``).
    scratch = None if not has_children else \
        thread_scratch((2 if vrank else 1) * span * buf.itemsize, buf.dtype)
    for lo in range(0, buf.size, seg):
        part = buf[lo:lo + seg]
        if has_children and vrank != 0:
            part = scratch[span:span + part.size]
            np.copyto(part, buf[lo:lo + seg])
        mask = 1
        while mask < n:
            if vrank & mask:
                send(t, part, _real(vrank - mask, root, n), fp)
                break
            if vrank + mask < n:
                got = scratch[:part.size]
                recv(t, got, _real(vrank + mask, root, n), fp)
                combine(part, got, out=part)  # the lower vranks' partial result goes first
            mask <<= 1


def gather(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray | None, root: int,
           fp: Fingerprint) -> None:
    """``recvbuf`` (n*m elements) of ``root`` gets every rank's ``sendbuf`` (m) in rank order."""
    n, m = t.world_size, sendbuf.size
    vrank = _root_relative_rank(t, root, recvbuf, m, "gather root needs an output")
    if n == 1 or m == 0:
        if vrank == 0:
            np.copyto(recvbuf, sendbuf)
        return
    span = _span(vrank, n)
    if span == 1:  # a leaf: its block goes up as it is
        send(t, sendbuf, _real(vrank - _lowbit(vrank), root, n), fp)
        return
    # The root's subtree is every vrank; with root 0 vrank order is rank order, so no staging.
    # Other subtrees are staged in this thread's scratch, kept between calls.
    stage = recvbuf if vrank == 0 and root == 0 else \
        thread_scratch(span * m * sendbuf.itemsize, sendbuf.dtype)
    np.copyto(stage[:m], sendbuf)
    mask = 1
    while mask < n:
        if vrank & mask:
            send(t, stage, _real(vrank - mask, root, n), fp)
            return
        child = vrank + mask
        if child < n:
            child_span = min(mask, n - child)
            recv(t, stage[mask * m:(mask + child_span) * m], _real(child, root, n), fp)
        mask <<= 1
    if root:
        # vrank v holds real rank (v + root) % n: rotate the blocks back into rank order
        head = (n - root) * m
        np.copyto(recvbuf[root * m:], stage[:head])
        np.copyto(recvbuf[:root * m], stage[head:])


def scatter(t: Transport, sendbuf: np.ndarray | None, recvbuf: np.ndarray, root: int,
            fp: Fingerprint) -> None:
    """``recvbuf`` (m elements) gets block ``rank`` of ``root``'s ``sendbuf`` (n*m elements)."""
    n, m = t.world_size, recvbuf.size
    vrank = _root_relative_rank(t, root, sendbuf, m, "scatter root needs an input")
    if n == 1 or m == 0:
        if vrank == 0:
            np.copyto(recvbuf, sendbuf)
        return
    if vrank == 0:
        top = _top_mask(n)
        stage = sendbuf
        if root:  # put the blocks in vrank order: vrank v is real rank (v + root) % n
            stage = thread_scratch(n * m * sendbuf.itemsize, sendbuf.dtype)
            head = (n - root) * m
            np.copyto(stage[:head], sendbuf[root * m:])
            np.copyto(stage[head:], sendbuf[:root * m])
    else:
        top = _lowbit(vrank)
        span = _span(vrank, n)
        # a leaf receives its block in place; a subtree's blocks land in this thread's scratch
        stage = recvbuf if span == 1 else \
            thread_scratch(span * m * recvbuf.itemsize, recvbuf.dtype)
        recv(t, stage, _real(vrank - top, root, n), fp)
    mask = top >> 1
    while mask:
        child = vrank + mask
        if child < n:
            child_span = min(mask, n - child)
            send(t, stage[mask * m:(mask + child_span) * m], _real(child, root, n), fp)
        mask >>= 1
    if stage is not recvbuf:
        np.copyto(recvbuf, stage[:m])
