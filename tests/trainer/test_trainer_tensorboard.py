"""TensorBoard event files: valid TFRecord framing and the scalar values, decoded independently."""

import struct
import zlib  # noqa: F401  (crc32c is not in the standard library; the framing is checked by recomputation)

from tradewind.trainer.tensorboard import EventWriter, crc32c


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> list[tuple[int, object]]:
    """(field number, value) pairs of a protobuf message: varints, doubles, floats and byte strings."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 1:
            value, pos = struct.unpack("<d", data[pos : pos + 8])[0], pos + 8
        elif wire == 5:
            value, pos = struct.unpack("<f", data[pos : pos + 4])[0], pos + 4
        else:
            length, pos = read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        out.append((number, value))
    return out


def records(raw: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(raw):
        (length,) = struct.unpack("<Q", raw[pos : pos + 8])
        out.append(raw[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4
    return out


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_event_file_holds_a_version_header_then_one_event_per_scalars_call(tmp_path):
    with EventWriter(tmp_path / "tb") as writer:
        writer.scalars(5, {"loss": 2.5, "lr": 0.001})
        writer.scalars(10, {"loss": 2.0})
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    events = [dict(fields(record)) for record in records(path.read_bytes())]
    assert events[0][3] == b"brain.Event:2"
    assert [event[2] for event in events[1:]] == [5, 10]
    values = [dict(fields(v)) for _, v in fields(events[1][5])]
    assert [(v[1], round(v[2], 6)) for v in values] == [(b"loss", 2.5), (b"lr", 0.001)]


def test_a_value_past_float32s_range_is_written_as_infinite_and_nan_stays_nan(tmp_path):
    # A diverging run's grad norm can pass 3.4e38, which a float32 cannot hold; that used to crash the run.
    with EventWriter(tmp_path / "tb") as writer:
        writer.scalars(1, {"grad_norm": 1e39, "loss": -1e39, "param_norm": float("nan")})
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    event = dict(fields(records(path.read_bytes())[1]))
    values = {v[1]: v[2] for v in (dict(fields(value)) for _, value in fields(event[5]))}
    assert values[b"grad_norm"] == float("inf") and values[b"loss"] == float("-inf")
    assert values[b"param_norm"] != values[b"param_norm"]  # NaN
