"""The shared-memory transport: every rank of one machine maps one segment.

Read in this order:

- ``segment``: POSIX shared-memory segments, created, attached, and unlinked even on SIGTERM.
- ``layout``: where everything lives in the segment (control lines, p2p rings, workspace).
- ``futex`` and ``waiting``: how a rank waits for a word another rank writes (spin, yield,
  sleep in the kernel), bounded by the timeout and watching the peers' liveness.
- ``transport``: ``ShmTransport``, the rendezvous; ``rings``: its point-to-point messages.
- ``cross_memory``: reading a peer's memory directly, and the ranks' agreement on it at set-up.
- ``generation``: the one barrier every collective here runs on.
- ``reference``: the direct all-reduce at its plainest, to read before the fast one.
- ``collectives``: ``ShmCollectives``, what ``native_collectives()`` returns: argument checks,
  and the choice between a plan (small) and the round-based algorithms of ``direct`` (large).
- ``tuning`` and ``single_copy``: which large all-reduce runs (a measured table), and the
  all-reduce and broadcast by peer reads.
- ``plans``, ``compiled``, ``kernels`` and ``entry_kernels``: small collectives prepared once
  per shape, in Python and as Numba kernels taking the same steps.
- ``short_calls`` (and ``two_array_calls``): the public calls' short path, one compiled call per
  hot shape.
- ``writer`` and ``stream``: large copies into the workspace, plain or with streaming stores.

Nothing outside this folder needs more than ``create`` (through ``transports.create_transport``),
the ``ShmTransport`` class, the segment functions and ``Generation`` (DDP's shared buckets run
on it in a segment of their own).
"""
from __future__ import annotations

from .generation import Generation
from .layout import ShmLayout
from .segment import attach_segment, create_segment, unlink_segment
from .transport import (DEFAULT_SLOT_BYTES, DEFAULT_SLOTS, DEFAULT_WORKSPACE_BYTES, ShmTransport,
                        create)

__all__ = ["DEFAULT_SLOTS", "DEFAULT_SLOT_BYTES", "DEFAULT_WORKSPACE_BYTES", "Generation", "ShmLayout", "ShmTransport", "attach_segment", "create",
           "create_segment", "unlink_segment"]
