"""The names and keys of a stream's objects: log entries and Delta checkpoints by version,
fragments by producer, epoch and sequence number, and the producer ids and consumer group
names they carry, each checked before it names anything."""

from __future__ import annotations

import re
import uuid

from lakestream.store.base import check_key

LOG_DIR = "_delta_log/"
DATA_DIR = "data/"
_PLAIN_DATA_KEY = re.compile(r"data/(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)+[A-Za-z0-9_-][A-Za-z0-9._-]*"
                             r"\.parquet")
"""Keys check_data_key accepts without a closer look: ASCII names that cannot be '.' or '..'
(none starts with a dot)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Producer ids and consumer group names: they name folders and objects."""
# [0-9], not \d: \d also matches non-ASCII digits, which int() would accept.
_LOG_ENTRY = re.compile(r"_delta_log/([0-9]{20})\.json")
_CHECKPOINT = re.compile(
    r"_delta_log/([0-9]{20})\.checkpoint(?:\.([0-9]{10})\.([0-9]{10}))?\.parquet")


def log_key(version: int) -> str:
    return f"{LOG_DIR}{version:020d}.json"


def log_version(key: str) -> int:
    """The version of a log entry key, ``_delta_log/<20-digit version>.json``.

    Raises:
        ValueError: ``key`` is anything else under (or outside) the log: a Delta checkpoint,
            ``_last_checkpoint``, a ``.crc`` file, a compacted log file, a temporary file.
    """
    m = _LOG_ENTRY.fullmatch(key)
    if m is None:
        raise ValueError(f"{key!r} is not a log entry key ({LOG_DIR}<20-digit version>.json)")
    return int(m.group(1))


def is_delta_checkpoint_key(key: str) -> int | None:
    """The version of a Delta checkpoint file, or None if ``key`` is not one.

    Matches classic checkpoints, ``_delta_log/<version>.checkpoint.parquet``, and parts of
    multi-part ones, ``_delta_log/<version>.checkpoint.<part>.<parts>.parquet``. A multi-part
    checkpoint is usable only once all its parts exist: the caller checks that. UUID-named
    (v2) checkpoints are not matched: they are valid only in tables declaring the
    ``v2Checkpoint`` feature, which streams do not, so counting one could drop log entries
    that readers still need.
    """
    m = _CHECKPOINT.fullmatch(key)
    if m is None:
        return None
    if m.group(2) is not None and not 1 <= int(m.group(2)) <= int(m.group(3)):
        return None  # part 0, or part 3 of 2: no writer produces that
    return int(m.group(1))




ANONYMOUS = "_append"
"""The data folder of ``Stream.append`` (plain appends belong to no producer); no producer
id can clash with it, since ids start with a letter or digit."""
_KEY = re.compile(rf"{re.escape(DATA_DIR)}([^/]+)/([0-9]+)-([0-9]+)-[^/]*\.parquet")


def fragment_key(producer: str, epoch: int, seq: int) -> str:
    """``data/<producer>/<epoch>-<seq>-<uuid>.parquet``: unique even across zombies."""
    return f"{DATA_DIR}{producer}/{epoch}-{seq}-{uuid.uuid4().hex}.parquet"


def key_writer(key: str) -> tuple[str | None, int, int] | None:
    """``(producer, epoch, seq)`` of a fragment key that ``fragment_key`` made (producer
    None for ``Stream.append``'s), or None for a key of another shape."""
    m = _KEY.fullmatch(key)
    if m is None:
        return None
    producer = None if m.group(1) == ANONYMOUS else m.group(1)
    return producer, int(m.group(2)), int(m.group(3))


def check_producer_id(producer_id: str) -> str:
    """Returns ``producer_id`` if it can name a folder of the stream.

    Raises:
        ValueError: not 1-128 characters of letters, digits, ``.``, ``_``, ``-``, starting
            with a letter or digit.
    """
    if not isinstance(producer_id, str) or not _NAME.fullmatch(producer_id):
        raise ValueError(
            f"producer id {producer_id!r} is not valid: use 1-128 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    return producer_id


def valid_group(group: object) -> bool:
    """Whether ``group`` can name a consumer group (see ``check_group``)."""
    return isinstance(group, str) and _NAME.fullmatch(group) is not None


def check_group(group: str) -> str:
    """Returns ``group`` if it can name a consumer group.

    Raises:
        ValueError: not 1-128 letters, digits, '.', '_' or '-', starting with a letter or
            digit.
    """
    if not valid_group(group):
        raise ValueError(f"consumer group {group!r} is not valid: use 1-128 letters, digits, "
                         "'.', '_' or '-', starting with a letter or digit")
    return group


def check_data_key(key: str) -> str:
    """A fragment key must be a safe key under ``data/``.

    Raises:
        ValueError: it is not.
    """
    if type(key) is str and _PLAIN_DATA_KEY.fullmatch(key):
        return key  # what producers write: the full check would pass, at a fifth the cost
    check_key(key)
    if not key.startswith(DATA_DIR) or not key.endswith(".parquet"):
        raise ValueError(f"fragment key {key!r} is not a .parquet file under {DATA_DIR}")
    return key
