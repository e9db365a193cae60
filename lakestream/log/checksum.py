"""An entry's checksum: the CRC-32 of its lines as compact JSON, carried as the last key of
its first line. Every path takes it with ``entry_checksum`` over the same bytes: writing,
reading bytes laid out as written (nothing serialised again), and reading any other layout
(its lines serialised again)."""

from __future__ import annotations

import json
import re
from typing import Any

from zlib_ng import zlib_ng


def entry_checksum(first: bytes, rest: bytes) -> int:
    """The checksum of an entry: CRC-32 of its lines as compact JSON joined by newlines, its
    first line (the commitInfo) without the checksum itself; ``rest`` is every line after the
    first, each after its newline. A damaged entry that still parses is caught (object
    stores check transfers, not rot).

    Every path computes it here, on the same bytes: ``encode_entry`` on the lines it
    writes, ``decode_entry`` on the raw lines of an entry laid out as written (``as_written``,
    nothing serialised again), and on any other entry's lines serialised again
    (``lines_checksum``).
    """
    return zlib_ng.crc32(rest, zlib_ng.crc32(first))


_CLOSE = b"}}}"
"""How an entry's first line ends: its ``lakestream`` object, ``commitInfo`` and the line
close at once. The checksum goes in as the last key of the first, so it is the tail that
``as_written`` cuts."""
_CRC_TAIL = re.compile(rb',"crc32":(0|[1-9][0-9]{0,9})\}\}\}\Z')


def with_checksum(first: bytes, crc: int) -> bytes:
    """The first line with ``crc`` as the last key of its ``lakestream`` object."""
    return first[:-len(_CLOSE)] + b',"crc32":%d' % crc + _CLOSE


def as_written(data: bytes) -> int | None:
    """The checksum of ``data`` if it is byte for byte as ``encode_entry`` writes it (the
    CRC-32 at the end of its first line matches the raw lines with it cut out), else None:
    checking the raw bytes saves serialising every line again (``lines_checksum``)."""
    first = data.find(b"\n")
    if first < 0 or not data.endswith(b"\n"):
        return None
    tail = _CRC_TAIL.search(data, 0, first)
    if tail is None:
        return None
    stored = int(tail.group(1))
    head = data[:tail.start()] + _CLOSE
    return stored if entry_checksum(head, data[first:-1]) == stored else None


def lines_checksum(lines: list[Any]) -> int:
    """The checksum of an entry whose lines are ``lines`` (parsed, the checksum taken out of
    the first), each serialised again as compact JSON (``entry_checksum``)."""
    dumped = [json.dumps(a, separators=(",", ":")).encode() for a in lines]
    return entry_checksum(dumped[0] if dumped else b"",
                          b"".join(b"\n" + line for line in dumped[1:]))
