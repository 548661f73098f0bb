"""The file ``save`` writes: one safetensors file, its arrays and its metadata.

The metadata holds ``neural_arch.format`` ("1"), ``neural_arch.structure`` (the JSON of
``structure``) and ``neural_arch.sha256``: the SHA-256 of the whole file as written with those
64 hex digits set to "0", so that a byte changed anywhere after saving is reported as damage
instead of loaded. Files saved before the digest was added have none and load unchecked.
``reading`` reads these files back.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List

import numpy as np

FORMAT_KEY, FORMAT_VERSION = "neural_arch.format", "1"
STRUCTURE_KEY = "neural_arch.structure"
DIGEST_KEY = "neural_arch.sha256"
MAX_HEADER = 100 * 2 ** 20  # safetensors' own limit on the JSON header
BLANK_DIGEST = b"0" * 64
DIGEST_FIELD = f'"{DIGEST_KEY}":"'.encode()  # how safetensors writes the key, before the value
METADATA_KEYS = (FORMAT_KEY, STRUCTURE_KEY, DIGEST_KEY)


def not_ours(name: str, reason: str) -> ValueError:
    return ValueError(f"load: {name} is not a file written by neural_arch.save ({reason}); "
                      f"load never unpickles. A plain safetensors file of arrays is read by "
                      f"neural_arch.nn.load_state_dict_file")


def damaged(name: str, reason: str) -> ValueError:
    return ValueError(f"load: {name} is damaged: {reason}")


def file_pieces(arrays: Dict[str, np.ndarray], structure: Any) -> List[memoryview]:
    """The bytes of the file, in pieces to write one after another (no copy of the arrays)."""
    from safetensors.numpy import save as to_bytes

    metadata = {FORMAT_KEY: FORMAT_VERSION, DIGEST_KEY: BLANK_DIGEST.decode(),
                STRUCTURE_KEY: json.dumps(structure, allow_nan=False, separators=(",", ":"))}
    data = to_bytes(arrays, metadata=metadata)
    header_end = 8 + int.from_bytes(data[:8], "little")
    found = data.find(DIGEST_FIELD + BLANK_DIGEST + b'"', 8, header_end)
    if found < 0:
        raise RuntimeError(f"save: safetensors did not write the metadata {DIGEST_KEY} as "
                           f"{(DIGEST_FIELD + BLANK_DIGEST).decode()!r}; cannot add the digest")
    at = found + len(DIGEST_FIELD)
    view = memoryview(data)
    digest = hashlib.sha256(view[:at])
    digest.update(BLANK_DIGEST)
    digest.update(view[at + 64:])
    return [view[:at], memoryview(digest.hexdigest().encode()), view[at + 64:]]
