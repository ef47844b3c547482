"""Read an offline W&B run file (`run-ID.wandb`) back, as `wandb sync` would upload it.

wandb >= 0.19 ships no Python reader for these files any more (its Go core writes and
syncs them), so the test reads the container itself: a LevelDB-style log ("`:W&B`",
magic 0xBEE1, a version byte, then 32 KiB blocks of records with a 7-byte header: crc32,
length, type FULL/FIRST/MIDDLE/LAST), each record a protobuf message of wandb's own
schema, wandb.proto.wandb_internal_pb2.Record.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        elif kind == 0 and length == 0:  # zero padding at the end of the file
            break


def read_run(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(config, history by step) of one offline run file; a step logged in several calls
    is one row, as W&B shows it."""
    from wandb.proto import wandb_internal_pb2

    config: dict[str, Any] = {}
    history: dict[int, dict[str, Any]] = {}
    for raw in raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            items = record.run.config.update if kind == "run" else record.config.update
            for item in items:
                key = item.key or "/".join(item.nested_key)
                config[key] = json.loads(item.value_json)
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                   for item in record.history.item}
            history.setdefault(int(row["_step"]), {}).update(row)
    return config, history
