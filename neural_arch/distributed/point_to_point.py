"""Point-to-point messages: ``send`` and ``recv``, with PyTorch's signatures.

Messages between two ranks match in the order they were sent. Each direction to each peer has
its own sequence numbers, apart from the group's collectives, so a message is never taken for
a collective's traffic; ``tag`` is carried in the fingerprint, so a tag mismatch is an error
rather than a silent match.
"""
from __future__ import annotations

from typing import Any, Optional

from .algorithms import exchange
from .buffers import Flat, checked_array
from .group.world import ProcessGroup, resolve_group


def _p2p(tensor: Any, peer_rank: int, group: Optional[ProcessGroup], tag: int,
         sending: bool):
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
    return pg.run(run, False, fp, op)


def send(tensor: Any, dst: int, group: Optional[ProcessGroup] = None, tag: int = 0):
    """Send ``tensor`` to rank ``dst``, which must call ``recv`` with a matching tensor."""
    return _p2p(tensor, dst, group, tag, sending=True)


def recv(tensor: Any, src: int, group: Optional[ProcessGroup] = None, tag: int = 0):
    """Receive into ``tensor`` from rank ``src`` (messages match in order); returns ``tensor``."""
    return _p2p(tensor, src, group, tag, sending=False)
