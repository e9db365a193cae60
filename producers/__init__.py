"""The producer SDK: write samples to a stream exactly once, committed with DAC."""

from __future__ import annotations

from lakestream.producers.importing import ImportResult, import_dataset
from lakestream.producers.options import CommitPolicy, ProducerOptions
from lakestream.producers.policy import IntervalController
from lakestream.producers.producer import Producer
from lakestream.producers.stats import ProducerStats

__all__ = ["CommitPolicy", "ImportResult", "IntervalController", "Producer", "ProducerOptions",
           "ProducerStats", "import_dataset"]
