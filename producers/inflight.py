"""A producer's writes between ``write`` and their commit: the seqs handed out, the state
each carries, what is in flight, what is committed, and the first background failure. The
writer, the upload threads and the committer meet here, under one condition, and nowhere
else."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Counted(Protocol):
    """A fragment as the in-flight budget counts it."""

    @property
    def rows(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


class InFlight:
    """The writes of a producer whose last committed seq is ``committed_seq`` with
    ``state``."""

    def __init__(self, committed_seq: int, state: Any) -> None:
        self._cond = threading.Condition()
        self.committed_seq = committed_seq
        self.committed_state = state
        self._next_seq = committed_seq + 1
        self._last_state = state
        self.fragments = 0
        """Fragments written and not committed."""
        self._bytes = 0
        self.rows = 0
        """Rows written and not committed."""
        self._error: BaseException | None = None
        self._closed = False

    def admit(self, nbytes: int, rows: int, state: Any, *, max_fragments: int,
              max_bytes: int, submit: Callable[[int, Any], None]) -> int:
        """Waits for room in the budget (a write may always go when nothing is in flight),
        then hands out the next seq and calls ``submit(seq, state carried)`` before another
        writer can take one: the upload pool gets seqs in order even from several writer
        threads, which the upload window relies on (a seq behind blocked threads would wait
        for ever). ``state`` None carries the last one.

        Raises:
            BaseException: the background failure, if one happened.
        """
        with self._cond:
            while self._error is None and self.fragments and (
                    self.fragments >= max_fragments or self._bytes + nbytes > max_bytes):
                self._cond.wait(0.5)
            self._raise()
            seq = self._next_seq
            self._next_seq += 1
            self.fragments += 1
            self._bytes += nbytes
            self.rows += rows
            if state is not None:
                self._last_state = state
            submit(seq, self._last_state)
            return seq

    def upload_turn(self, seq: int, ahead: int) -> bool:
        """Waits until ``seq`` is at most ``ahead`` past the last committed seq (a window,
        not a count: the lowest seq not committed may always go, so the commits this waits
        for can always happen); False if the producer failed or stopped meanwhile."""
        with self._cond:
            while seq > self.committed_seq + ahead and self._error is None \
                    and not self._closed:
                self._cond.wait(0.5)
            return self._error is None and not self._closed

    def committed(self, fragments: Sequence[Counted], last_seq: int, state: Any) -> None:
        """Notes the commit of ``fragments``, the last of them ``last_seq`` with ``state``."""
        with self._cond:
            self.committed_seq = max(self.committed_seq, last_seq)
            self.committed_state = state
            self.fragments -= len(fragments)
            self._bytes -= sum(u.nbytes for u in fragments)
            self.rows -= sum(u.rows for u in fragments)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Keeps the first background failure, for the writer's next call to raise."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    @property
    def failed(self) -> bool:
        return self._error is not None

    def check(self) -> None:
        """Raises the background failure, if one happened."""
        with self._cond:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def wait_committed(self, timeout: float | None, who: str) -> None:
        """Returns when every seq handed out so far is committed.

        Raises:
            TimeoutError: not within ``timeout`` seconds (``who`` names the producer).
            BaseException: the background failure, if one happened.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._next_seq - 1
            while self.committed_seq < target and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{who}: seq {target} not committed within {timeout}s")
                self._cond.wait(0.5 if left is None else min(0.5, left))
            self._raise()

    def close(self) -> None:
        """Stops the uploads waiting for their turn: they leave their fragments uncommitted."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
