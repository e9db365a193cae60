"""Parquet's Thrift compact protocol, read in bounded time and memory: structs parsed to a
depth of ``MAX_DEPTH``, fields 1-8 kept, anything else skipped, damage reported as ``Damage``
(``read/pages.py`` turns it into a ValueError naming the page); lists of structs walked
element by element (``struct_list``), for the footer's row groups and column chunks."""

from __future__ import annotations

from collections.abc import Callable, Mapping

MAX_DEPTH = 8
"""The deepest nesting of structs, lists, sets and maps parsed or skipped (a page header
with statistics nests 3 deep); a deeper one is damage, never a RecursionError."""

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

# Compact-protocol types: the low nibble of a field header, or of a list's element header.
T_STOP, T_TRUE, T_FALSE, T_BYTE, T_I16, T_I32, T_I64, T_DOUBLE = 0, 1, 2, 3, 4, 5, 6, 7
T_BINARY, T_LIST, T_SET, T_MAP, T_STRUCT = 8, 9, 10, 11, 12


Fields = dict[int, object]
"""A struct's fields 1-8 as read: field id -> value: an i32 as an int, a bool as a bool, a
struct as its fields if kept (else empty), any other as (compact type, value or None)."""


class Damage(Exception):
    """What is wrong with a header: raised inside the parser, reported as a ValueError."""


class Past(Exception):
    """The header runs past the bytes it may take (as an IndexError from indexing does)."""


def varint(mv: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos``: its value, and where it ends."""
    value = shift = 0
    for i in range(pos, pos + 10):
        b = mv[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    raise Damage("a varint longer than 10 bytes")


def field_head(mv: memoryview, pos: int, fid: int) -> tuple[int, int, int]:
    """The field header at ``pos``, after field ``fid`` of its struct: the field's compact
    type (``T_STOP``: the struct ends), its id, and where its value starts."""
    head = mv[pos]
    t = head & 0x0F
    if t == T_STOP:
        return t, fid, pos + 1
    if head > 0x0F:
        return t, fid + (head >> 4), pos + 1
    n, pos = varint(mv, pos + 1)
    fid = (n >> 1) ^ -(n & 1)
    if not -0x8000 <= fid < 0x8000:
        raise Damage(f"field id {fid} is not an i16")
    return t, fid, pos


def read_struct(mv: memoryview, pos: int, depth: int, keep: int) -> tuple[Fields, int]:
    """Reads the struct at ``pos``, nested at ``depth``: its fields 1-8 if ``keep`` > 0 (the
    structs among them kept to ``keep - 1`` levels), and where it ends. Every other field is
    read past, whatever its type."""
    if depth > MAX_DEPTH:
        raise Damage(f"nested deeper than {MAX_DEPTH}")
    fields: Fields = {}
    fid = 0
    while True:
        t, fid, pos = field_head(mv, pos, fid)
        if t == T_STOP:
            return fields, pos
        value: object = None
        if t == T_I32 or t == T_I64 or t == T_I16:
            n = mv[pos]
            if n < 0x80:  # the common one-byte varint, inline
                pos += 1
            else:
                n, pos = varint(mv, pos)
            value = (n >> 1) ^ -(n & 1)
            if t != T_I32:
                value = (t, value)
        elif t == T_TRUE or t == T_FALSE:  # a bool field's value is in its type
            value = t == T_TRUE
        elif t == T_STRUCT:
            value, pos = read_struct(mv, pos, depth + 1, keep - 1)
        elif t == T_BINARY:  # statistics' min and max, inline
            n = mv[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = varint(mv, pos)
            pos += n
            if pos > len(mv):
                raise Past
            value = (t, None)
        else:
            pos = skip(mv, pos, t, depth)
            value = (t, None)
        if keep > 0 and 0 < fid <= 8:
            fields[fid] = value


def walk_struct(mv: memoryview, pos: int, depth: int,
                reads: Mapping[int, tuple[int, Callable[[int], int]]]) -> int:
    """Reads past the struct at ``pos``, nested at ``depth``, calling ``read(pos)`` at the
    value of each field ``reads`` names as ``fid: (compact type, read)`` where it has that
    type (``read`` returns where the value ends). Returns where the struct ends."""
    if depth > MAX_DEPTH:
        raise Damage(f"nested deeper than {MAX_DEPTH}")
    fid = 0
    while True:
        t, fid, pos = field_head(mv, pos, fid)
        if t == T_STOP:
            return pos
        how = reads.get(fid)
        if how is not None and how[0] == t:
            pos = how[1](pos)
        elif t == T_I32 or t == T_I64 or t == T_I16:  # the common ones, inline
            while mv[pos] >= 0x80:
                pos += 1
            pos += 1
        elif t != T_TRUE and t != T_FALSE:  # a bool field's value is in its type
            pos = skip(mv, pos, t, depth)


def list_head(mv: memoryview, pos: int, depth: int) -> tuple[int, int, int]:
    """The header of the list at ``pos``, in a container nested at ``depth``: its number of
    elements, their compact type, and where they start."""
    if depth >= MAX_DEPTH:
        raise Damage(f"nested deeper than {MAX_DEPTH}")
    head = mv[pos]
    pos += 1
    n, kind = head >> 4, head & 0x0F
    if n == 15:
        n, pos = varint(mv, pos)
    if kind == T_STOP or kind > T_STRUCT:
        raise Damage(f"unknown compact type {kind} in a list")
    # Every element takes a byte at least: a list longer than the bytes left is found
    # before any element is read, and reading the rest costs a byte's work a byte.
    if n > len(mv) - pos:
        raise Past
    return n, kind, pos


def struct_list(mv: memoryview, pos: int, depth: int, element: Callable[[int], int]) -> int:
    """Reads past the list of structs at ``pos`` (in a struct nested at ``depth``), calling
    ``element(pos)`` at each element, which returns where it ends. Returns where the list
    ends."""
    n, kind, pos = list_head(mv, pos, depth)
    if kind != T_STRUCT:
        raise Damage(f"a list of compact type {kind} where structs belong")
    for _ in range(n):
        pos = element(pos)
    return pos


def skip(mv: memoryview, pos: int, t: int, depth: int) -> int:
    """Reads past a value of compact type ``t`` in a container nested at ``depth`` (a bool
    takes a byte: this is a list's or a map's element, or a field of another type)."""
    if t == T_I32 or t == T_I64 or t == T_I16:
        return varint(mv, pos)[1]
    if t == T_BINARY:
        n, pos = varint(mv, pos)
        return ahead(mv, pos, n)
    if t == T_BYTE or t == T_TRUE or t == T_FALSE:
        return ahead(mv, pos, 1)
    if t == T_DOUBLE:
        return ahead(mv, pos, 8)
    if t == T_STRUCT:
        return read_struct(mv, pos, depth + 1, 0)[1]
    if t == T_LIST or t == T_SET:
        n, kind, pos = list_head(mv, pos, depth)
        if kind == T_BYTE or kind == T_TRUE or kind == T_FALSE:
            return pos + n
        if kind == T_DOUBLE:
            return ahead(mv, pos, 8 * n)
        if kind == T_I32 or kind == T_I64 or kind == T_I16:  # varints, inline
            for _ in range(n):
                while mv[pos] >= 0x80:
                    pos += 1
                pos += 1
            return pos
        if kind == T_BINARY:  # column paths, inline
            for _ in range(n):
                size, pos = varint(mv, pos)
                pos = ahead(mv, pos, size)
            return pos
        if kind == T_STRUCT:
            for _ in range(n):
                pos = read_struct(mv, pos, depth + 2, 0)[1]
            return pos
        for _ in range(n):
            pos = skip(mv, pos, kind, depth + 1)
        return pos
    if t == T_MAP:
        if depth >= MAX_DEPTH:
            raise Damage(f"nested deeper than {MAX_DEPTH}")
        n, pos = varint(mv, pos)
        if n == 0:
            return pos
        kinds = mv[pos]
        pos += 1
        keys, values = kinds >> 4, kinds & 0x0F
        for kind in (keys, values):
            if kind == T_STOP or kind > T_STRUCT:
                raise Damage(f"unknown compact type {kind} in a map")
        if n > (len(mv) - pos) // 2:  # two bytes an entry at least
            raise Past
        for _ in range(n):
            pos = skip(mv, pos, keys, depth + 1)
            pos = skip(mv, pos, values, depth + 1)
        return pos
    raise Damage(f"unknown compact type {t}")


def ahead(mv: memoryview, pos: int, n: int) -> int:
    if n > len(mv) - pos:
        raise Past
    return pos + n


def i32_field(fields: Fields, fid: int, name: str) -> int:
    value = fields.get(fid)
    if type(value) is int:  # an i32 field's (bool, a subclass, is a bool field's)
        if _I32_MIN <= value <= _I32_MAX:
            return value
        raise Damage(f"{name} {value} is not an i32")
    if value is None:
        raise Damage(f"{name} is missing")
    raise Damage(f"{name} has compact type {type_of(value)}, not i32")


def count_field(fields: Fields, fid: int, name: str) -> int:
    value = fields.get(fid)
    if type(value) is int and 0 <= value <= _I32_MAX:
        return value
    if type(value) is int and value < 0:
        raise Damage(f"{name} is negative ({value})")
    return i32_field(fields, fid, name)  # raises: what is wrong


def bool_field(fields: Fields, fid: int, name: str, default: bool) -> bool:
    value = fields.get(fid, default)
    if isinstance(value, bool):
        return value
    raise Damage(f"{name} has compact type {type_of(value)}, not bool")


def struct_field(fields: Fields, fid: int, name: str) -> Fields:
    value = fields.get(fid)
    if isinstance(value, dict):
        return value
    if value is None:
        raise Damage(f"a page of its type without {name}")
    raise Damage(f"{name} has compact type {type_of(value)}, not struct")


def type_of(value: object) -> int:
    """The compact type a field's value was read from (see ``Fields``)."""
    if isinstance(value, bool):
        return T_TRUE if value else T_FALSE
    if isinstance(value, int):
        return T_I32
    if isinstance(value, tuple):
        return int(value[0])
    return T_STRUCT
