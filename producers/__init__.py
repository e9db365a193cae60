"""The producer SDK: write samples to a stream exactly once, committed with DAC."""

from __future__ import annotations

from lakestream.producers.options import CommitPolicy, ProducerOptions
from lakestream.producers.policy import IntervalController
from lakestream.producers.producer import Producer
from lakestream.producers.stats import ProducerStats

__all__ = ["CommitPolicy", "IntervalController", "Producer", "ProducerOptions", "ProducerStats"]
