"""TensorBoard event files for scalar metrics, written without TensorFlow or tensorboardX.

An event file is a TFRecord stream of `Event` protocol buffers. Scalars need only four message fields,
so the encoder here writes them by hand: `Event{wall_time=1 (double), step=2 (int64), file_version=3
(string), summary=5}`, `Summary{value=1 (repeated)}`, `Summary.Value{tag=1 (string), simple_value=2
(float)}`. Each record is `length (uint64) | masked crc32c(length) | data | masked crc32c(data)`.

Example:
    with EventWriter(run_dir / "tensorboard") as writer:
        writer.scalars(step, {"loss": 2.1, "lr": 3e-3})
"""

from __future__ import annotations

import math
import socket
import struct
import time
from pathlib import Path

FLOAT32_MAX = 3.4028234663852886e38


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """The CRC-32C (Castagnoli) checksum of `data`, as TFRecord uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _as_float32(value: float) -> float:
    """`value` as a float32 holds it: past float32's range (a diverging grad norm, say) it is infinite."""
    return math.copysign(math.inf, value) if abs(value) > FLOAT32_MAX else value  # NaN stays NaN


def encode_event(wall_time: float, step: int, *, scalars: dict[str, float] | None = None, version: str = "") -> bytes:
    """One serialized `Event` with the given scalars (or the file-version header when `version` is set)."""
    event = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if version:
        event += _field(3, 2, version.encode())
    if scalars:
        values = b"".join(
            _field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", _as_float32(value))))
            for tag, value in scalars.items()
        )
        event += _field(5, 2, values)
    return event


def encode_record(data: bytes) -> bytes:
    """`data` framed as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))


class EventWriter:
    """Appends scalar summaries to a new `events.out.tfevents.*` file in `directory`."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = self.directory / f"events.out.tfevents.{int(now)}.{socket.gethostname()}"
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open for the run)
        self._file.write(encode_record(encode_event(now, 0, version="brain.Event:2")))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Record `values` at `step`; flushed at once so TensorBoard sees a live run."""
        self._file.write(encode_record(encode_event(time.time(), step, scalars=values)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
