"""TensorBoard event files read back for the tests: the TFRecord frames tensorboardX writes
(8-byte length, its masked CRC-32C, an ``Event`` protobuf, the protobuf's masked CRC-32C),
each CRC checked with tensorboardX's own ``masked_crc32c`` and each record parsed with its
``event_pb2``, so a torn or misframed file fails the test rather than reading short."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict, List, Tuple

EVENT_FILE_GLOB = "events.out.tfevents.*"


def event_files(directory) -> List[Path]:
    return sorted(Path(directory).glob(EVENT_FILE_GLOB))


def read_events(path) -> list:
    """Every ``Event`` of one file, in order."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c
    data = Path(path).read_bytes()
    events, at = [], 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert header_crc == masked_crc32c(header), f"{path}: bad length CRC at byte {at}"
        body = data[at + 12:at + 12 + length]
        assert len(body) == length, f"{path}: record at byte {at} cut short"
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert body_crc == masked_crc32c(body), f"{path}: bad record CRC at byte {at}"
        events.append(event_pb2.Event.FromString(body))
        at += 16 + length
    return events


def scalars(directory) -> Dict[str, List[Tuple[int, float]]]:
    """{tag: [(step, value), ...]} over every event file of ``directory``."""
    found: Dict[str, List[Tuple[int, float]]] = {}
    for path in event_files(directory):
        for event in read_events(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found
