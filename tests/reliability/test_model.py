"""A model-based test: produce, crash, restart, lost acks, store faults, snapshots, markers,
retention, gc and reads in any order, checked against a simple model after every rule."""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import lakestream
from lakestream.errors import LakestreamError, StoreError
from lakestream.log.keys import LOG_DIR
from lakestream.log.opening import load_state
from lakestream.log.replay import ReplayState
from lakestream.log.snapshot import write_snapshot
from lakestream.log.tail import read_tail
from lakestream.producers import Producer
from lakestream.store import ObjectStore
from tests.conftest import SOAK
from tests.helpers import SCHEMA, rows

B, G = 8, 4


class FlakyStore:
    """Fails the next put (``fail``), or lets the next log-entry put land and then loses
    its reply (``lose``)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.armed: str | None = None

    def put(self, key: str, data: bytes, *, mode: Any = "overwrite") -> None:
        armed, self.armed = self.armed, None
        if armed == "fail":
            raise StoreError(f"injected failure writing {key}")
        self.inner.put(key, data, mode=mode)
        if armed == "lose" and key.startswith(LOG_DIR):
            raise StoreError(f"injected lost reply writing {key}")
        if armed == "lose":
            self.armed = armed  # wait for a log entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _summary(state: ReplayState) -> tuple[Any, ...]:
    return (state.version, state.next_offset, state.reclaimed_below,
            [(f.path, f.offset, f.rows) for f in state.all_fragments()],
            {k: (p.epoch, p.seq, p.state) for k, p in state.producers.items()},
            {g: [(m.step, m.version) for m in ms] for g, ms in state.markers.items()})


class Pipeline(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.uri = tempfile.mkdtemp() + "/s"
        self.stream = lakestream.create(self.uri, SCHEMA, global_batch_size=B, group_size=G,
                                        snapshot_interval=4)
        self.producer: Producer | None = None
        self.flaky: FlakyStore | None = None
        self.committed = 0  # groups the model knows are committed
        self.unsure = False  # a write failed: the truth is learnt on restart
        self.point = 0  # retention point (steps) the model allows
        self.marks: list[int] = []
        self.restart()

    def teardown(self) -> None:
        if self.producer is not None:
            self.producer.abort()

    @rule()
    def restart(self) -> None:
        if self.producer is not None:
            self.producer.abort()
        self.producer = Producer(self.uri, "w")
        self.flaky = FlakyStore(self.producer.stream.store)
        self.producer.stream.store = self.flaky  # type: ignore[misc]
        state = self.producer.state
        self.committed = state["next"] if state else 0  # exactly what was committed
        self.unsure = False

    @precondition(lambda self: self.producer is not None)
    @rule(n=st.integers(1, 4))
    def produce(self, n: int) -> None:
        assert self.producer is not None
        try:
            for g in range(self.committed, self.committed + n):
                self.producer.write(rows(G * g, G), state={"next": g + 1})
            self.producer.flush()
            self.committed += n
        except LakestreamError:
            # A client whose write failed stops its producer (its committer could still be
            # landing earlier uploads) and restarts it to learn what landed.
            self.producer.abort()
            self.producer = None
            self.unsure = True

    @precondition(lambda self: self.producer is not None)
    @rule()
    def crash(self) -> None:
        assert self.producer is not None
        self.producer.abort()  # like SIGKILL: nothing more is committed
        self.producer = None
        self.restart()

    @precondition(lambda self: self.producer is not None)
    @rule(how=st.sampled_from(["lose", "fail"]))
    def inject(self, how: str) -> None:
        assert self.flaky is not None
        self.flaky.armed = how

    @rule()
    def snapshot(self) -> None:
        self.stream.refresh()
        write_snapshot(self.stream.store, self.stream.state)

    @rule(data=st.data())
    def mark(self, data: st.DataObject) -> None:
        self.stream.refresh()
        if self.stream.num_steps >= self.point:
            step = data.draw(st.integers(self.point, self.stream.num_steps))
            self.stream.mark_checkpoint("train", step)
            self.marks.append(step)

    @rule(keep=st.integers(1, 3))
    def retain(self, keep: int) -> None:
        self.stream.retain(keep_last=keep)
        if self.marks:
            self.point = max(self.point, min(self.marks[-keep:]))

    @rule()
    def gc(self) -> None:
        self.stream.gc(grace_seconds=0, delta_checkpoint=False)

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        s = self.stream
        s.refresh()
        if s.num_steps <= self.point:
            return
        step = data.draw(st.integers(self.point, s.num_steps - 1))
        world = data.draw(st.sampled_from([1, 2]))
        parts = [s.read_step(step, rank=r, world_size=world).column("id").to_pylist()
                 for r in range(world)]
        assert sum(parts, []) == list(range(B * step, B * step + B))

    @invariant()
    def log_equals_model(self) -> None:
        s = self.stream
        s.refresh()
        if not self.unsure:
            assert s.num_samples == G * self.committed
        ids = [i for step in range(self.point, s.num_steps)
               for i in s.read_step(step).column("id").to_pylist()]
        assert ids == list(range(B * self.point, B * s.num_steps))

    @invariant()
    def snapshot_plus_tail_is_full_replay(self) -> None:
        store = self.stream.store
        full = read_tail(store, ReplayState())
        assert _summary(load_state(store, self.uri)) == _summary(full)

    @invariant()
    def nothing_retained_is_reclaimed(self) -> None:
        assert self.stream.state.reclaimed_below <= self.point * B


TestPipeline = Pipeline.TestCase
TestPipeline.settings = settings(max_examples=120 if SOAK else 15, stateful_step_count=25,
                                 deadline=None)
