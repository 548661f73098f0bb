"""Point-to-point messages: ``send`` and ``recv``, with PyTorch's signatures.

Messages between two ranks match in the order they were sent. Each direction to each peer has
its own sequence numbers, apart from the group's collectives, so a message is never taken for
a collective's traffic; ``tag`` is carried in the fingerprint, so a tag mismatch is an error
rather than a silent match.

``batch_isend_irecv`` (with ``P2POp``, as in PyTorch) moves several messages together: every
send and receive of the batch progresses at once, so two ranks that send each other more than
the transport buffers (MPI's rendezvous, a full shared-memory ring, full socket buffers) do not
both wait for the other's receive. Pipeline schedules rely on it where one stage sends an
activation forward while the next sends a gradient back.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Union

from ..algorithms import exchange
from ..buffers import Flat, checked_array
from ..group.world import ProcessGroup, resolve_group
from ..work import Work


def _p2p(tensor: Any, peer_rank: int, group: Optional[ProcessGroup], tag: int,
         sending: bool, async_op: bool = False):
    op = "send" if sending else "recv"
    pg = resolve_group(group)
    pg.check_usable(op)
    peer = pg.group_rank_of(peer_rank, "dst" if sending else "src")
    if peer == pg.rank:
        raise ValueError(f"rank {pg.global_rank} cannot {op} to or from itself")
    arr = checked_array(tensor, f"{op} tensor", writable=not sending)
    fp = pg.p2p_fingerprint(op, peer, f"p2p:{int(tag)}", arr.dtype, arr.size)

    def run():
        flat = Flat(arr)
        if sending:
            exchange.send(pg.transport, flat.buf, peer, fp)
        else:
            exchange.recv(pg.transport, flat.buf, peer, fp)
            flat.commit()
        return tensor
    return pg.run(run, async_op, fp, op)


def send(tensor: Any, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0):
    """Send ``tensor`` to rank ``dst``, which must call ``recv`` with a matching tensor."""
    return _p2p(tensor, dst, group, tag, sending=True)


def recv(tensor: Any, src: int, group: Optional[ProcessGroup] = None, tag: int = 0):
    """Receive into ``tensor`` from rank ``src`` (messages match in order); returns ``tensor``."""
    return _p2p(tensor, src, group, tag, sending=False)


def isend(tensor: Any, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> Work:
    """``send`` queued behind this process's earlier asynchronous calls; returns its ``Work``.

    Queued calls run one at a time, in issue order: two ranks that ``isend`` each other large
    messages before receiving still wait on each other. ``batch_isend_irecv`` is the way to
    move both directions at once."""
    return _p2p(tensor, dst, group, tag, sending=True, async_op=True)


def irecv(tensor: Any, src: int, group: Optional[ProcessGroup] = None, tag: int = 0) -> Work:
    """``recv`` queued behind this process's earlier asynchronous calls; returns its ``Work``."""
    return _p2p(tensor, src, group, tag, sending=False, async_op=True)


_SENDS = ("send", "isend")
_RECVS = ("recv", "irecv")


def _direction(op: Any) -> str:
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name in _SENDS or op in (send, isend):
        return "send"
    if name in _RECVS or op in (recv, irecv):
        return "recv"
    raise ValueError(f"P2POp op must be isend or irecv (or send/recv, or their names), got "
                     f"{op!r}")


class P2POp:
    """One message of a ``batch_isend_irecv`` batch (PyTorch's ``P2POp``): ``op`` is
    ``isend``/``irecv`` (``send``/``recv`` and the names ``"isend"``/``"irecv"`` work too),
    ``peer`` a global rank, ``group`` the group it belongs to (``None``: the world)."""

    def __init__(self, op: Union[Callable, str], tensor: Any, peer: int,
                 group: Optional[ProcessGroup] = None, tag: int = 0) -> None:
        self.direction = _direction(op)
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag

    def __repr__(self) -> str:
        return f"P2POp({self.direction}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> List[Work]:
    """Move every message of the list together; returns one completed ``Work`` per op.

    All ops must name the same group. Messages to (from) one peer match the peer's messages in
    list order, exactly as the same ``send``/``recv`` calls one after another would, so a batch
    on one side may meet plain calls on the other. The call returns once every message of the
    batch has moved (PyTorch returns works to wait on; these are already complete).
    """
    ops = list(p2p_op_list)
    if not ops:
        raise ValueError("batch_isend_irecv needs at least one P2POp, got an empty list")
    for i, item in enumerate(ops):
        if not isinstance(item, P2POp):
            raise TypeError(f"batch_isend_irecv item {i} must be a P2POp, got "
                            f"{type(item).__name__}")
    groups = {id(resolve_group(item.group)) for item in ops}
    if len(groups) != 1:
        raise ValueError(f"all ops of batch_isend_irecv must use the same group; the {len(ops)} "
                         f"ops name {len(groups)} different groups")
    pg = resolve_group(ops[0].group)
    pg.check_usable("batch_isend_irecv")
    checked = []  # every op is checked before any takes a sequence number
    for i, item in enumerate(ops):
        what = f"batch_isend_irecv op {i} ({item.direction})"
        peer = pg.group_rank_of(item.peer, "peer")
        if peer == pg.rank:
            raise ValueError(f"{what}: rank {pg.global_rank} cannot {item.direction} to or from "
                             "itself")
        sending = item.direction == "send"
        checked.append((item, peer, checked_array(item.tensor, f"{what} tensor",
                                                  writable=not sending)))
    sends, recvs, flats = [], [], []
    for item, peer, arr in checked:
        sending = item.direction == "send"
        fp = pg.p2p_fingerprint(item.direction, peer, f"p2p:{int(item.tag)}", arr.dtype,
                                arr.size)
        flat = Flat(arr)
        (sends if sending else recvs).append((flat.buf, peer, fp))
        if not sending:
            flats.append(flat)
    first = (sends or recvs)[0][2]

    def run():
        exchange.batch(pg.transport, sends, recvs)
        for flat in flats:
            flat.commit()
    pg.run(run, False, first, "batch_isend_irecv")
    return [Work.completed("batch_isend_irecv", item.tensor, pg.global_rank) for item in ops]
