"""Producer options, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lakestream.writing import MAX_FRAGMENTS_PER_ENTRY, CommitOptions, check_int

CommitPolicy = Literal["adaptive", "per-fragment"]
ShareCommits = Literal["host", "store"] | None


@dataclass(frozen=True)
class ProducerOptions:
    """How a Producer uploads and commits.

    ``commit_policy="adaptive"`` is DAC (group commit, adaptive interval);
    ``"per-fragment"`` commits one fragment per entry with a fixed retry, for comparison.
    """

    commit_policy: CommitPolicy = "adaptive"
    upload_threads: int | None = None
    """Threads that encode and upload fragments. None: 4 on a remote store, where a put
    waits on the network; on a local disk, where a put is CPU work too, one per core up to
    4 (threads past the cores only take turns: on 2 cores, one producer spent 13% more CPU
    per GB uncompressed with 4 than with 2)."""
    max_inflight_fragments: int = 1024
    max_inflight_bytes: int = 256 << 20
    max_fragment_bytes: int = 1 << 30
    """A write whose encoded fragment is larger raises ValueError (nothing is uploaded)."""
    max_sample_bytes: int = 64 << 20
    """A write holding a sample (row) larger than this raises ValueError, naming the row."""
    compression: str = "zstd"
    """``zstd`` (level ``compression_level``) or ``none`` (the fast path: no compression)."""
    compression_level: int = 1
    min_interval_s: float = 0.01
    """With the adaptive policy, the least time from one commit landing to the next
    starting: a producer writing flat out commits at most this often and carries more
    fragments in each (a commit costs CPU the encoding would use). A write after a quiet
    spell still commits at once. Independent of ``max_interval_s``, DAC's longest wait."""
    max_interval_s: float = 5.0
    max_fragments_per_commit: int = 10_000
    progress_poll_s: float = 0.05
    commit: CommitOptions = field(default_factory=CommitOptions)
    share_commits: ShareCommits = None
    """``"host"``: the producers of this host that set it (processes or threads) commit
    through one of them at a time, in one entry for them all, each keeping its own epoch,
    seqs and state there (``lakestream.producers.hostcommit``); a log taking one commit at
    a time then carries a host's producers per commit. None: each commits alone. Needs the
    host folder (``LAKESTREAM_HOST_DIR``; turned off, each commits alone) and the adaptive
    policy. A stream with a shared entry is read by lakestream from this version on only.
    ``"store"``: the same, and the host's committer also leaves what the host has waiting in
    the store, where the committers of other hosts that set it commit it with their own
    (``lakestream.log.storeruns``): a sample waits for the next commit of any host, not of
    its own, where many hosts take turns at one log."""

    def __post_init__(self) -> None:
        if self.commit_policy not in ("adaptive", "per-fragment"):
            raise ValueError(f"commit_policy must be 'adaptive' or 'per-fragment', "
                             f"got {self.commit_policy!r}")
        for name in ("upload_threads", "max_inflight_fragments", "max_inflight_bytes",
                     "max_fragment_bytes", "max_sample_bytes", "max_fragments_per_commit"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), least=1,
                                                     optional=True))
        if self.max_fragments_per_commit > MAX_FRAGMENTS_PER_ENTRY:
            raise ValueError(f"max_fragments_per_commit must be at most "
                             f"{MAX_FRAGMENTS_PER_ENTRY:,} (readers void a larger entry), got "
                             f"{self.max_fragments_per_commit:,}")
        if self.share_commits not in (None, "host", "store"):
            raise ValueError(f"share_commits must be None, 'host' or 'store', got "
                             f"{self.share_commits!r}")
        if self.share_commits and self.commit_policy != "adaptive":
            raise ValueError(f"share_commits={self.share_commits!r} needs "
                             "commit_policy='adaptive': the host's committer groups its "
                             "producers' fragments")
        if self.compression not in ("zstd", "none", "snappy", "lz4"):
            raise ValueError(f"compression must be zstd, snappy, lz4 or none, "
                             f"got {self.compression!r}")
        for name in ("min_interval_s", "max_interval_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.progress_poll_s <= 0:
            raise ValueError("progress_poll_s must be positive")
