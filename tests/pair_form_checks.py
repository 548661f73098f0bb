"""What the two-rank forms with the root check in front of their data (``pair_broadcast``,
``algorithms.pair``) must show on both ranks, checked alike for each: each rank's report holds
``mismatch`` (the errors of a call where both ranks passed themselves as the root, then one
where each passed the other), ``after`` (an all-reduce of ones afterwards) and ``across`` (the
error of a call at the form's limit against one an element above it)."""
from __future__ import annotations

from typing import Sequence


def check_roots_named_and_group_usable(per_rank: Sequence[dict]) -> None:
    for r in per_rank:
        both, neither = r["mismatch"]
        assert "rank 0 passed root 0; rank 1 passed root 1" in both, both
        assert "rank 0 passed root 1; rank 1 passed root 0" in neither, neither
        assert r["after"] == [2.0, 2.0, 2.0]


def check_limit_mismatch_named(per_rank: Sequence[dict], n: int) -> None:
    """The rank that reads the other's header first names both calls (``n`` and ``n + 1``
    float32); its peer may then find the connection gone before it reads that rank's message
    (tcp), a named failure too."""
    kinds = [r["across"][0] for r in per_rank]
    assert all(kind in ("CollectiveMismatchError", "PeerFailureError") for kind in kinds), kinds
    assert any(kind == "CollectiveMismatchError" and f"{n} x float32" in message
               and f"{n + 1} x float32" in message for kind, message in
               (r["across"] for r in per_rank)), per_rank
