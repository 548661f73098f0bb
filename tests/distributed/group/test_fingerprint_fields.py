"""``ProcessGroup.fingerprint`` builds its ``Fingerprint`` with ``tuple.__new__`` and positional
values, which neither checks their number nor names them: a field added to ``Fingerprint`` (or
two reordered) must show here, not as a short tuple or swapped values on the wire."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.group import world as pgm
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.work import CommQueue

pytestmark = pytest.mark.timeout(30)


def test_a_collectives_fingerprint_holds_every_field_by_name():
    group = pgm.ProcessGroup(3, [0, 2], 2, None, CommQueue(2, 1.0), "tcp", 1.0, True)
    built = group.fingerprint("all_reduce:sum", np.float32, 10)
    expected = Fingerprint(op="all_reduce:sum", seq=1, dtype="float32", count=10, group=3)
    assert len(built) == len(Fingerprint._fields), (
        f"ProcessGroup.fingerprint passed {len(built)} values for the fields "
        f"{Fingerprint._fields}")
    assert {name: getattr(built, name) for name in Fingerprint._fields} == expected._asdict()
