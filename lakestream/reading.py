"""What the core offers a loader SDK (``lakestream.loaders``), and all it may use below the
``Stream`` façade: the steps a reader takes (a mix's, or a stream's under a read-time
policy) and resume positions, reading tensor columns straight into arrays, the buffer
pool, the CPU slots and the disk cache, progress objects and checkpoint markers, the
filesystem checkpoints go through, and the crash points its tests arm. Everything else in
the core is the core's own and may change; ``tests/test_layering.py`` holds the SDK to this
list."""

from __future__ import annotations

from lakestream.checks import check_int, check_names
from lakestream.failpoints import failpoint
from lakestream.log.keys import check_group
from lakestream.log.progress import Progress, publish_progress, read_progress
from lakestream.log.replay import Marker
from lakestream.plan.mix import resume_position
from lakestream.read.selected import COUNTS_KEY, Accept, ReadPolicy, SelectedSteps
from lakestream.read.steps import MixSteps, Source, Steps, check_columns, mix_steps, stream_steps
from lakestream.read.tensors import Direct, binary_chunks, copy_values, direct_columns
from lakestream.schema.arrays import as_numpy
from lakestream.schema.tensors import TensorSpec, tensor_spec
from lakestream.store import is_remote, open_filesystem
from lakestream.store.base import ObjectStore
from lakestream.store.diskcache import DiskCache
from lakestream.store.pool import buffer_pool
from lakestream.store.slots import cpu_slots

__all__ = ["COUNTS_KEY", "Accept", "Direct", "DiskCache", "Marker", "MixSteps", "ObjectStore",
           "as_numpy",
           "Progress", "ReadPolicy", "SelectedSteps", "Source", "Steps", "TensorSpec",
           "binary_chunks", "buffer_pool", "check_columns", "check_group", "check_int",
           "check_names", "copy_values", "cpu_slots", "direct_columns", "failpoint",
           "is_remote", "mix_steps", "open_filesystem", "publish_progress", "read_progress",
           "resume_position", "stream_steps", "tensor_spec"]
