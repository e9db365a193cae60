"""The log: the commit and its records (docs/design.md §2-§7). Entries and their Delta Lake
encoding, replay, the fragment index, snapshots and opening, the log reader, the transaction,
retention and gc; the log's records are importable from here."""

from __future__ import annotations

from lakestream.log.entries import (
    Append,
    Checkpoint,
    Compacted,
    Create,
    Entry,
    Fence,
    FragmentRef,
    Reclaim,
    Register,
    RemoveGroup,
    Seal,
    StreamMeta,
)

__all__ = ["Append", "Checkpoint", "Compacted", "Create", "Entry", "Fence", "FragmentRef",
           "Reclaim", "Register", "RemoveGroup", "Seal", "StreamMeta"]
