"""Where everything lives in a job's shared-memory segment.

Counters sit on 128-byte lines, one writer per line, so ranks never write the same cache line
(and the adjacent-line prefetcher never couples two writers). Every barrier in this folder
(``generation``) runs on lines of this shape: the transport's segment has one per rank, and so
does the segment of DDP's shared buckets.
"""
from __future__ import annotations

LINE_WORDS = 16
AREA_BYTES = 128
PAGE = 4096
# Words of a rank's control line: barrier generation, fingerprint signature and sequence number
# of the collective at each generation parity, pid, the "closed" flag, which counter word
# (index + 1) this rank sleeps on in the kernel (0: none), and a free word for the owner of
# the line (DDP's shared buckets count there the syncs a rank finished reading). Then the words
# of peer reads (``cross_memory``): the probe token and the address of this rank's private copy
# of it, this rank's verdict on reading its peers, and the address of the buffer of the
# collective it runs now. Last the generation this rank left early (0: none): a compiled
# broadcast's root returns once its data is in place, and checks that every reader reached
# that generation (with the same fingerprint) before it writes anything for the next one
# (``generation``); only the owner of the line reads that word. Then whether this rank's
# workspace writer streams every large copy (``collectives.peer_reads_agreed``).
GEN, SIG0, SEQ0, SIG1, SEQ1, PID, CLOSED, SLEEP, SPARE = range(9)
PROBE_TOKEN, PROBE_ADDRESS, PEER_READ, BUFFER, EARLY, STORES = range(9, 15)


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class ShmLayout:
    """Byte offsets of everything in a job's segment; equal on every rank given the params.

    Order: control lines (one per rank, then written/read lines per ordered channel), each
    rank's two fingerprint-header areas, each channel's slot-header areas, channel data
    slots, and the workspace: for each of two parities, one input area per rank and one result
    area, ``workspace_bytes`` each.
    """

    def __init__(self, world_size: int, slots: int, slot_bytes: int, workspace_bytes: int) -> None:
        for name, value, low in (("world_size", world_size, 1), ("slots", slots, 1),
                                 ("slot_bytes", slot_bytes, 1), ("workspace_bytes",
                                                                 workspace_bytes, PAGE)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        p = world_size
        self.world_size, self.slots = p, slots
        self.slot_bytes = round_up(slot_bytes, PAGE)
        self.workspace_bytes = round_up(workspace_bytes, PAGE)
        self.rank_headers_at = (p + 2 * p * p) * LINE_WORDS * 8
        self.slot_headers_at = self.rank_headers_at + 2 * p * AREA_BYTES
        self.slot_data_at = round_up(self.slot_headers_at + p * p * slots * AREA_BYTES, PAGE)
        self.workspace_at = self.slot_data_at + p * p * slots * self.slot_bytes
        self.total_bytes = self.workspace_at + 2 * (p + 1) * self.workspace_bytes
        self.gen_words = [self.rank_word(r, GEN) for r in range(p)]
        self.peers = [tuple(q for q in range(p) if q != r) for r in range(p)]

    def params(self) -> dict:
        return {"world_size": self.world_size, "slots": self.slots,
                "slot_bytes": self.slot_bytes, "workspace_bytes": self.workspace_bytes}

    def rank_word(self, rank: int, field: int) -> int:
        return rank * LINE_WORDS + field

    def written_word(self, src: int, dst: int) -> int:
        return (self.world_size + 2 * (src * self.world_size + dst)) * LINE_WORDS

    def read_word(self, src: int, dst: int) -> int:
        return self.written_word(src, dst) + LINE_WORDS

    def rank_header(self, rank: int, parity: int) -> int:
        return self.rank_headers_at + (2 * rank + parity) * AREA_BYTES

    def _slot_index(self, src: int, dst: int, slot: int) -> int:
        return (src * self.world_size + dst) * self.slots + slot

    def slot_header(self, src: int, dst: int, slot: int) -> int:
        return self.slot_headers_at + self._slot_index(src, dst, slot) * AREA_BYTES

    def slot_data(self, src: int, dst: int, slot: int) -> int:
        return self.slot_data_at + self._slot_index(src, dst, slot) * self.slot_bytes

    def ws_input(self, parity: int, rank: int) -> int:
        return self.workspace_at + (parity * (self.world_size + 1) + rank) * self.workspace_bytes

    def ws_result(self, parity: int) -> int:
        return self.ws_input(parity, self.world_size)
