"""What the core offers a producer SDK (``lakestream.producers``), and all it may use below
the ``Stream`` façade: the builds of what a producer commits (its fence, and its appends,
alone or shared by its host's producers, with the seal, fence and seq checks made on the
state they commit on), the host's folder of runs waiting for a shared commit, encoding and
putting a fragment, whether its store is remote, checking data against the schema, its
progress reads, and the crash points its tests arm. Everything else in the core is the
core's own and may change; ``tests/test_layering.py`` holds the SDK to this list."""

from __future__ import annotations

from lakestream.checks import check_int
from lakestream.failpoints import failpoint
from lakestream.log.commits import Run, appending, fencing, refuse_if_fenced, sharing
from lakestream.log.entries import MAX_FRAGMENTS_PER_ENTRY, MAX_STATE_BYTES, Fence, check_state
from lakestream.log.fragments import check_rows, encode_fragment, put_fragment, row_group_target
from lakestream.log.hostruns import HostRuns, Published
from lakestream.log.keys import check_group, check_producer_id, fragment_key
from lakestream.log.outcomes import CommitOptions, CommitResult
from lakestream.log.progress import Progress, read_progress
from lakestream.log.replay import refuse_if_sealed
from lakestream.log.storeruns import PooledRuns
from lakestream.schema.conform import conform, oversized_sample, warm_conversion
from lakestream.store import is_remote
from lakestream.store.base import ObjectStore

__all__ = ["MAX_FRAGMENTS_PER_ENTRY", "MAX_STATE_BYTES", "CommitOptions", "CommitResult", "Fence",
           "HostRuns", "ObjectStore", "PooledRuns", "Progress", "Published", "Run", "appending",
           "check_group", "check_int", "check_producer_id", "check_rows", "check_state", "conform",
           "encode_fragment", "failpoint", "fencing", "fragment_key", "is_remote",
           "oversized_sample", "put_fragment", "read_progress", "refuse_if_fenced",
           "refuse_if_sealed", "row_group_target", "sharing", "warm_conversion"]
