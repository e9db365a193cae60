"""The steps a StreamDataset reads and the state that resumes them: its sources, the plan
over them (a mix, a read-time policy, or one stream in log order; opened when first needed,
and again in each DataLoader worker), the next step to read, and how a saved state moves
them (``loaders/resume.py`` has its format and cases)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from torch.utils.data import get_worker_info

from lakestream.errors import LakestreamError
from lakestream.loaders.options import ReadOptions
from lakestream.loaders.resume import (
    STATE_VERSION,
    Base,
    Resume,
    changed_mix_starts,
    check_batch_size,
    check_named,
    check_streams,
    dataset_states,
    refuse_worker_state,
    worker_next,
)
from lakestream.reading import SelectedSteps, Source, Steps, mix_steps, stream_steps
from lakestream.stream import Stream


def sources_of(uri: str | Sequence[Source], options: ReadOptions) -> list[Source]:
    """The sources a dataset of ``uri`` reads: a stream URI is one source (taking
    ``batch_size`` a step where one is chosen at read time: same order, same resume, same
    markers in the stream's own steps), a list of ``Source`` a mix.

    Raises:
        TypeError: ``uri`` is neither. ValueError: ``batch_size`` with a mix.
    """
    if isinstance(uri, str):
        return [Source(uri, options.batch_size, storage_options=options.storage_options)]
    if options.batch_size is not None:
        raise ValueError("batch_size= reads one stream: a mix's step is the sum of its "
                         "sources' takes (Source(uri, take=n))")
    sources = [s if s.storage_options is not None or options.storage_options is None
               else Source(s.uri, s.take, s.cycle, options.storage_options) for s in uri]
    if not sources or not all(isinstance(s, Source) for s in sources):
        raise TypeError("uri must be a stream URI or a non-empty list of Source")
    return sources


class PlannedSteps:
    """What ``sources`` read with ``options`` yields step by step, and where it resumes.

    Raises:
        ValueError: a read-time policy with a mix, a batch size, a shuffle or epochs, or an
            ``accept`` that its module and name do not find again.
    """

    def __init__(self, sources: list[Source], options: ReadOptions) -> None:
        self.sources, self.options = sources, options
        self.uri = " + ".join(s.uri for s in sources)
        self.policy = options.policy()
        if options.accept is not None:
            check_named(options.accept)
        if self.policy.active and (len(sources) > 1 or sources[0].take is not None
                                   or sources[0].cycle or options.shuffle_window is not None
                                   or options.epochs is not None):
            raise ValueError("read-time policies (max_staleness, accept, balance) read one "
                             "stream's own steps in log order: they do not combine with "
                             "mixing, batch_size, shuffle_window or epochs")
        self.start_step = options.start_step
        """The next step to read: where a state saved now resumes."""
        self.worker_next: int | None = None
        """In a DataLoader worker, the next step this worker reads (set by iterating it or by
        loading its state); None: ``start_step`` plus the worker's index."""
        self._base: Base = (0, [0] * len(sources))
        """The mix's (base step, source positions there): where a changed mix began."""
        self._keyed = True
        """Whether the plan keys each source's permutations by its stream's identity; a
        state saved before they were (its mix JSON has no "keyed") resumes keyed by index."""
        self._mix: Steps | None = None
        self._streams: list[Stream] | None = None
        if self.policy.active and self.start_step:  # planned from here, not from step 0
            self._base = (self.start_step, [self.start_step * self.global_batch_size])
            self._mix = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mix": None, "_streams": None}  # a worker opens its own

    @property
    def mix(self) -> Steps:
        """The plan over the sources' streams, opened on first use in each process."""
        if self._mix is None:
            base_step, starts = self._base
            streams = [Stream.open(s.uri, storage_options=s.storage_options,
                                   disk_cache=self.options.disk_cache) for s in self.sources]
            take = self.options.batch_size
            if take is not None and take % streams[0].group_size:
                raise ValueError(f"batch_size={take} splits the groups of {streams[0].uri} "
                                 f"(group size {streams[0].group_size}): pass a multiple "
                                 "of the group size")
            if self.policy.active:
                self._mix = SelectedSteps(streams[0], self.policy, base_step, starts[0])
            else:
                o = self.options
                self._mix = mix_steps(self.sources, streams, shuffle_window=o.shuffle_window,
                                      seed=o.seed, epochs=o.epochs, base_step=base_step,
                                      starts=starts, keyed=self._keyed)
            self._streams = streams
        return self._mix

    @property
    def streams(self) -> list[Stream]:
        """The handles on the sources' streams, in order (opened with ``mix``)."""
        self.mix  # noqa: B018 - opens them, with the plan over them
        assert self._streams is not None
        return self._streams

    @property
    def global_batch_size(self) -> int:
        """Samples per step, over all ranks (the sum of the sources' takes)."""
        return self.mix.global_batch_size

    def source_steps(self, step: int) -> list[int]:
        """Each source's own step from which a run resuming at mix step ``step`` may read:
        what its registration and markers hold."""
        return stream_steps(self.mix.hold_from(step), self.streams)

    # -- the saved state ----------------------------------------------------------------

    @property
    def _plain(self) -> bool:
        """One stream, whole steps, log order: the states of earlier versions."""
        o = self.options
        return len(self.sources) == 1 and self.sources[0].take is None \
            and not self.sources[0].cycle and o.shuffle_window is None \
            and o.epochs is None and self._base == (0, [0]) and not self.policy.active

    def _describe(self) -> dict[str, Any]:
        # "policy" is null without one, as in states saved before read policies existed.
        o = self.options
        return {"sources": [s.describe() for s in self.sources],
                "shuffle_window": o.shuffle_window, "seed": o.seed, "epochs": o.epochs,
                "policy": self.policy.describe() if self.policy.active else None}

    def _identities(self) -> list[tuple[str, str]]:
        """Each source's URI and the id of the stream there: a state resumes only the streams
        that saved it, not another one with the same batch size or URI."""
        return [(source.uri, stream.meta.table_id)
                for source, stream in zip(self.sources, self.streams, strict=True)]

    def state_dict(self, group: str | None) -> dict[str, Any]:
        """See ``StreamDataset.state_dict``."""
        state: dict[str, Any] = {"version": STATE_VERSION, "next_step": self.start_step,
                                 "group": group, "global_batch_size": self.global_batch_size}
        # Always present (null for one stream in log order): DCP loads into the keys the
        # fresh dataset's state has, and requires each of them in the checkpoint.
        state["mix"] = json.dumps(None)
        state["streams"] = json.dumps([{"uri": uri, "id": table_id}
                                       for uri, table_id in self._identities()])
        if not self._plain:
            base_step, starts = self._base
            cursors = self.mix.cursors(self.start_step)
            if self.policy.active:  # planned one step after another: resume from here
                base_step, starts = self.start_step, cursors
            state["mix"] = json.dumps({**self._describe(), "base_step": base_step,
                                       "starts": starts, "cursors": cursors,
                                       "keyed": self._keyed})
        info = get_worker_info()
        if info is not None:
            state.update(worker=info.id, num_workers=info.num_workers,
                         worker_next_step=self.worker_next if self.worker_next is not None
                         else self.start_step + info.id)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """See ``StreamDataset.load_state_dict``."""
        check_streams(state, self._identities(), self.global_batch_size)
        step = int(state["next_step"])
        saved = json.loads(state["mix"]) if "mix" in state else None
        if saved is None:
            check_batch_size(state, self.global_batch_size, self.uri)
        case = Resume.of(saved, self._describe(), policy=self.policy.active, plain=self._plain)
        if case.plans_again and "worker_next_step" in state:
            raise refuse_worker_state(saved)
        base, keyed = self._resumed(case, saved, step)
        if (base, keyed) != (self._base, self._keyed):
            self._mix = None  # planned again from the loaded base
        self._base, self._keyed = base, keyed
        self.start_step = step
        info = get_worker_info()
        self.worker_next = worker_next(state, None if info is None
                                       else (info.id, info.num_workers))

    def _resumed(self, case: Resume, saved: dict[str, Any] | None,
                 step: int) -> tuple[Base, bool]:
        """Where the steps are planned from after resuming at ``step`` in ``case``, and
        whether the plan keys permutations by the streams' identities.

        Raises:
            LakestreamError: the case cannot resume (a mix from a state in log order, a mix
                with epochs changed).
        """
        if case is Resume.LOG_ORDER:
            return self._base, self._keyed
        if case is Resume.POLICY_FROM_LOG_ORDER:  # planned one step after another from here
            return (step, [step * self.global_batch_size]), self._keyed
        if case is Resume.MIX_FROM_LOG_ORDER:
            raise LakestreamError(
                f"state was saved by a StreamDataset over one stream in log order, and "
                f"{self.uri} mixes, shuffles or repeats: start it at that step with "
                f"start_step={step} instead")
        assert saved is not None
        if case is Resume.SAME:
            return (int(saved["base_step"]), [int(x) for x in saved["starts"]]), \
                bool(saved.get("keyed", False))
        o = self.options
        starts = changed_mix_starts(saved, self.sources, [s.sealed_at for s in self.streams],
                                    shuffle_window=o.shuffle_window, seed=o.seed,
                                    epochs=o.epochs)
        return (step, starts), True

    def load_loader_state(self, state: Any) -> list[int] | None:
        """See ``StreamDataset.load_loader_state``."""
        found = dataset_states(state)
        if not found:
            return None
        self.load_state_dict(max(found, key=lambda s: int(s["next_step"])))
        if not self.policy.active:
            return None
        cursors = [json.loads(s["mix"])["cursors"] for s in found]
        return [min(int(c[i]) for c in cursors) for i in range(len(self.sources))]
