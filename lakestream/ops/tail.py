"""``lakestream tail``: a line every interval with the stream's version, steps, rate, producers
and a group's lag, until Ctrl-C."""

from __future__ import annotations

import json
import signal
import threading
import time

from lakestream.log.keys import check_group
from lakestream.log.progress import read_progress
from lakestream.ops.text import printable
from lakestream.stream import Stream


def tail(stream: Stream, interval: float, count: int, group: str, as_json: bool) -> None:
    """Prints a line every ``interval`` seconds: version, steps, rates, producers, lag.

    Ctrl-C (SIGINT) ends it between lines, as ``KeyboardInterrupt``: raised anywhere else, in
    the middle of a read with the shared thread pool, it could leave the pool's lock taken
    and the process hung at exit.

    Raises:
        ValueError: ``group`` is not a valid group name.
    """
    check_group(group)
    interrupted = threading.Event()
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    else:  # signals reach the main thread only; nothing to take over
        previous = None
    try:
        _tail(stream, interval, count, group, as_json, interrupted)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _tail(stream: Stream, interval: float, count: int, group: str, as_json: bool,
          interrupted: threading.Event) -> None:
    last_t, last_samples, n = time.monotonic(), stream.num_samples, 0
    while count <= 0 or n < count:
        if interrupted.wait(interval if n else 0):
            raise KeyboardInterrupt
        stream.refresh()
        now = time.monotonic()
        rate = (stream.num_samples - last_samples) / max(now - last_t, 1e-9)
        last_t, last_samples, n = now, stream.num_samples, n + 1
        progress = read_progress(stream.store, group)
        lag = None if progress is None else stream.num_steps - progress.step
        if as_json:
            print(json.dumps({"time": time.time(), "version": stream.version,
                              "steps": stream.num_steps, "samples": stream.num_samples,
                              "samples_per_s": rate, "group": group, "lag_steps": lag,
                              "producers": {p: {"epoch": e, "seq": q} for p, (e, q, _)
                                            in sorted(stream.producers.items())}}),
                  flush=True)
            continue
        producers = ", ".join(f"{printable(p)} epoch {e} seq {q}"
                              for p, (e, q, _) in sorted(stream.producers.items())) or "none"
        if lag is not None:
            where = f"group {group} lag {lag} steps"
        elif group in stream.state.groups:
            where = f"group {group}: no progress published yet"
        else:
            where = f"group {group}: not in this stream (no registration, marker or progress)"
        print(f"{time.strftime('%H:%M:%S')} version {stream.version} steps {stream.num_steps} "
              f"samples {stream.num_samples} ({rate:.0f}/s); {where}; producers {producers}",
              flush=True)
