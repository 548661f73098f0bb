"""Moving a batch of activations and gradients between stages, headers first.

A receiver cannot allocate an activation it knows nothing about, so each activation is two
messages: a fixed-size header (micro-batch, virtual stage, dtype, shape) and the payload. A
batch of the plan therefore goes as two ``batch_isend_irecv`` calls: first the headers and the
gradients (a gradient needs no header: its receiver made the activation it belongs to and
knows its shape), then the activation payloads. Both sides of every message put it in batches
of the same tick (``plan.build_plan``), and all ranks make both calls of a tick's batch, so
the calls pair up and ``batch_isend_irecv`` moves them without deadlock. The header also says
which micro-batch and stage it carries, so a plan mismatch is an error, not wrong data.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..collectives import point_to_point as p2p
from ..group.world import ProcessGroup
from .plan import Msg

TAG_HEADER, TAG_ACT, TAG_GRAD = 1, 2, 3
MAX_DIMS = 8
HEADER_LEN = 4 + MAX_DIMS  # micro-batch, virtual stage, dtype code, ndim, dims
_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex64", "complex128", "uint16", "uint32", "uint64")
_CODES = {name: i for i, name in enumerate(_DTYPES)}

Key = Tuple[str, int, int]  # (kind, virtual stage, micro-batch) as in ``Msg``


def encode_header(msg: Msg, arr: np.ndarray) -> np.ndarray:
    name = arr.dtype.name
    if name not in _CODES:
        raise TypeError(f"stage {msg.stage - 1} sends an activation of dtype {arr.dtype} for "
                        f"micro-batch {msg.mb}; supported: {', '.join(_DTYPES)}")
    if arr.ndim > MAX_DIMS:
        raise ValueError(f"stage {msg.stage - 1} sends an activation of shape {arr.shape} for "
                         f"micro-batch {msg.mb}; at most {MAX_DIMS} dimensions are supported")
    header = np.zeros(HEADER_LEN, np.int64)
    header[:4] = (msg.mb, msg.stage, _CODES[name], arr.ndim)
    header[4:4 + arr.ndim] = arr.shape
    return header


def decode_header(msg: Msg, header: np.ndarray) -> Tuple[Tuple[int, ...], np.dtype]:
    mb, stage, code, ndim = (int(v) for v in header[:4])
    if (mb, stage) != (msg.mb, msg.stage):
        raise ValueError(f"stage {msg.stage} expected the activation of micro-batch {msg.mb} "
                         f"from stage {msg.stage - 1} (rank {msg.src}) but got micro-batch {mb} "
                         f"for stage {stage}: the ranks run different schedules")
    if not 0 <= code < len(_DTYPES) or not 0 <= ndim <= MAX_DIMS:
        raise ValueError(f"stage {msg.stage} got a malformed activation header from rank "
                         f"{msg.src}: {header.tolist()}")
    return tuple(int(d) for d in header[4:4 + ndim]), np.dtype(_DTYPES[code])


def exchange(group: ProcessGroup, sends: Sequence[Msg], recvs: Sequence[Msg],
             outgoing: Dict[Key, np.ndarray], grad_meta: Dict[Key, Tuple[tuple, np.dtype]]
             ) -> Dict[Key, np.ndarray]:
    """One batch of the plan: send ``outgoing[key]`` for each of ``sends``; receive each of
    ``recvs`` (gradients shaped by ``grad_meta``). Returns the received arrays by key."""
    def key(msg: Msg) -> Key:
        return (msg.kind, msg.stage, msg.mb)

    ranks = group.ranks  # the plan names group ranks; P2POp takes global ones
    ops: List[p2p.P2POp] = []
    headers: Dict[Key, np.ndarray] = {}
    got: Dict[Key, np.ndarray] = {}
    payloads = {key(msg): np.ascontiguousarray(outgoing.pop(key(msg))) for msg in sends}
    for msg in sends:  # first: headers and gradients
        if msg.kind == "act":
            ops.append(p2p.P2POp("isend", encode_header(msg, payloads[key(msg)]), ranks[msg.dst],
                                 group, TAG_HEADER))
        else:
            ops.append(p2p.P2POp("isend", payloads[key(msg)], ranks[msg.dst], group, TAG_GRAD))
    for msg in recvs:
        if msg.kind == "act":
            headers[key(msg)] = buf = np.empty(HEADER_LEN, np.int64)
            ops.append(p2p.P2POp("irecv", buf, ranks[msg.src], group, TAG_HEADER))
        else:
            shape, dtype = grad_meta[key(msg)]
            got[key(msg)] = buf = np.empty(shape, dtype)
            ops.append(p2p.P2POp("irecv", buf, ranks[msg.src], group, TAG_GRAD))
    if ops:
        p2p.batch_isend_irecv(ops)
    ops = [p2p.P2POp("isend", payloads[key(msg)], ranks[msg.dst], group, TAG_ACT)
           for msg in sends if msg.kind == "act"]
    for msg in recvs:  # then the activations themselves
        if msg.kind == "act":
            shape, dtype = decode_header(msg, headers[key(msg)])
            got[key(msg)] = buf = np.empty(shape, dtype)
            ops.append(p2p.P2POp("irecv", buf, ranks[msg.src], group, TAG_ACT))
    if ops:
        p2p.batch_isend_irecv(ops)
    return got
