"""The one barrier of the shared-memory code: ranks arrive at numbered generations.

Each rank owns one control line (``layout``): it stores the generation it reached in its GEN
word and, before that, the signature and sequence number of the collective it runs in the
SIG/SEQ words of that generation's parity. A rank waits until every peer's GEN word reaches
the same generation, then compares the peers' signatures with its own, so ranks that run
different collectives raise an error naming both sides instead of reading wrong data.

Two parity slots suffice: a peer reaches generation g + 2, and so rewrites the slots of g's
parity, only after every rank arrived at g + 1, i.e. after this rank finished checking g.
Likewise for data: at generation g a rank writes only what its peers read after g, and reads
only what was written before it, so two halves of a workspace, alternated by parity, need one
barrier a round.

One collective leaves its generation early: the root of a compiled small broadcast
(``kernels.small_broadcast``) arrives and returns without waiting for the readers, as an eager
send does; only the readers wait (for every rank, the root included). Before such a rank
writes anything for the next generation it must know what a full generation would have told
it: that every peer reached the generation it left early (so none still reads the half it is
about to reuse, nor that generation's slots) with the same fingerprint. Its EARLY word holds
that generation until then; ``settle`` waits and checks (the compiled kernels check it
themselves and hand over only when a peer is late or differs), so a mismatch with a root
that left early is raised by the readers at once and by the root at its next collective.
A reader arrives when its call begins, before it copies: a peer at g finished g - 1, whose
half and slots g + 1 reuses, so the root's copy for g + 1 already overlaps the readers' copy
of g. Settling g only before g + 2 would need a third area (measured: no gain, ``plans``).

The transport's direct collectives, its small-message plans (in Python or compiled: they take
the same steps on the same words) and DDP's shared buckets all run on this barrier; the owner of
the words decides what a signature means and names a mismatch (``Generation.meet`` returns the
peer). Waits spin, then sleep in the kernel on the peer's word (``waiting.sleep_until_ge``),
bounded by the timeout and watching the peers' liveness.
"""
from __future__ import annotations

from typing import Any, Optional

from .layout import EARLY, GEN, LINE_WORDS, SEQ0, SIG0, SLEEP
from .waiting import sleep_until_ge, wake_sleepers


class Generation:
    """One rank's side of the barrier over ``ctrl``: int64 words (a memoryview cast to 'q')
    whose first ``world_size`` lines are the ranks' control lines, at ``base_address``. Waits
    take the ``watch`` (peer liveness) and ``timeout`` that ``transport`` has at the time."""

    def __init__(self, ctrl, base_address: int, rank: int, world_size: int,
                 transport: Any) -> None:
        self.ctrl, self.base_address = ctrl, base_address
        self.rank, self.world_size, self.transport = rank, world_size, transport
        self.peers = tuple(q for q in range(world_size) if q != rank)
        line = rank * LINE_WORDS
        self.gen_word, self.sleep_word = line + GEN, line + SLEEP
        self.early_word = line + EARLY
        self.own_slots = tuple(line + 2 * h for h in (0, 1))  # + SIG0 / + SEQ0, by parity
        self.peer_gen_words = tuple(q * LINE_WORDS + GEN for q in self.peers)
        self.peer_sleep_words = tuple(q * LINE_WORDS + SLEEP for q in self.peers)
        # (peer, its slots' first word) for each parity
        self.peer_slots = tuple(tuple((q, q * LINE_WORDS + 2 * h) for q in self.peers)
                                for h in (0, 1))

    @property
    def gen(self) -> int:
        """The last generation this rank arrived at: its own GEN word, which compiled code
        (``entry_kernels``) advances too."""
        return self.ctrl[self.gen_word]

    def publish(self, gen: int, sig: int, seq: int) -> None:
        """Store the signature and sequence number of the collective run at ``gen``."""
        slot = self.own_slots[gen & 1]
        self.ctrl[slot + SIG0] = sig
        self.ctrl[slot + SEQ0] = seq

    def arrive(self, gen: int) -> None:
        """Tell every rank that this rank reached ``gen`` (what it wrote before is in place)."""
        self.ctrl[self.gen_word] = gen
        wake_sleepers(self.ctrl, self.gen_word, self.peer_sleep_words, self.base_address)

    def wait(self, gen: int, op: str, seq: Optional[int], what: str = "") -> None:
        """Block until every peer has arrived at ``gen``."""
        ctrl, t = self.ctrl, self.transport
        for peer, word in zip(self.peers, self.peer_gen_words):
            if ctrl[word] < gen:
                sleep_until_ge(ctrl, word, gen, peer, t.watch, t.timeout, op, seq,
                               what or f"every rank to reach generation {gen}",
                               self.sleep_word, self.base_address)

    def differs(self, gen: int, sig: int, seq: int) -> int:
        """The first peer whose slots at ``gen`` hold another signature or sequence number,
        or -1 when every peer runs the same collective."""
        ctrl = self.ctrl
        for peer, slot in self.peer_slots[gen & 1]:
            if ctrl[slot + SIG0] != sig or ctrl[slot + SEQ0] != seq:
                return peer
        return -1

    def meet(self, gen: int, sig: int, seq: int, op: str, what: str = "") -> int:
        """Arrive at ``gen``, wait for every peer, and return ``differs`` (-1: all agree)."""
        self.arrive(gen)
        ctrl = self.ctrl
        for word in self.peer_gen_words:
            if ctrl[word] < gen:
                self.wait(gen, op, seq, what)
                break
        return self.differs(gen, sig, seq)

    def published(self, peer: int, gen: int) -> tuple[int, int]:
        """(signature, sequence number) that ``peer`` stored for ``gen``'s parity."""
        slot = peer * LINE_WORDS + 2 * (gen & 1)
        return self.ctrl[slot + SIG0], self.ctrl[slot + SEQ0]

    def left_early(self) -> int:
        """The generation this rank left without waiting for its peers, not yet settled (0:
        none). Read before writing anything for a new generation."""
        return self.ctrl[self.early_word]

    def settle(self, op: str, seq: Optional[int]) -> tuple[int, int]:
        """Wait until every peer reached the generation this rank left early and compare their
        fingerprints there with this rank's; returns (that generation, ``differs``). The debt
        is cleared either way: a mismatch is raised once, and both sides stand at the same
        generation after it."""
        early = self.ctrl[self.early_word]
        self.wait(early, op, seq, f"every rank to reach generation {early}, which this rank's "
                  "last broadcast (its root) returned from without waiting")
        sig, published_seq = self.published(self.rank, early)
        self.ctrl[self.early_word] = 0
        return early, self.differs(early, sig, published_seq)
