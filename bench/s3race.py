"""How long the S3 server of the tests takes to answer conditional puts that race.

Usage: .venv/bin/python -m bench.s3race [--writers 4] [--rounds 40] [--budget-s 120]
Writes bench/results/s3race.json.

A commit is a put of the next log version with ``If-None-Match: *``; when producers race for
a version, one put succeeds and the others get 412. On a store that answers the losers at
once, a lost race costs one round trip; a store that holds them costs that much more
staleness. Each round here, ``--writers`` threads (one boto3 client each, one attempt: no
client retries) put the same new key at once, behind a barrier; beside it, the same puts
of keys nobody races for. Reported: each answer's time, winners' and losers' apart, and
the share of rounds where some answer took half a second or more. SeaweedFS is started
here on 127.0.0.1 (``tests/s3server.py``).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from bench.output import command, save
from tests.s3server import BUCKET, start_s3


def _client(options: dict[str, str]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=options["AWS_ENDPOINT_URL"],
                        aws_access_key_id=options["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=options["AWS_SECRET_ACCESS_KEY"],
                        region_name=options["AWS_REGION"],
                        config=Config(retries={"max_attempts": 1}))


def _put(client: Any, key: str) -> tuple[str, float]:
    t = time.perf_counter()
    try:
        client.put_object(Bucket=BUCKET, Key=key, Body=b"{}" * 300, IfNoneMatch="*")
        return "won", time.perf_counter() - t
    except client.exceptions.ClientError as e:
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return ("lost" if status == 412 else f"http {status}"), time.perf_counter() - t


def _round(clients: list[Any], key: str) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = [("", 0.0)] * len(clients)
    barrier = threading.Barrier(len(clients))

    def go(i: int) -> None:
        barrier.wait()
        out[i] = _put(clients[i], key)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": 1e3 * _pct(xs, 0.5), "p99_ms": 1e3 * _pct(xs, 0.99),
            "max_ms": 1e3 * max(xs, default=float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=120.0, help="stop starting rounds after")
    args = ap.parse_args()
    server = start_s3()
    try:
        clients = [_client(server.options()) for _ in range(args.writers)]
        alone = [_put(clients[0], f"s3race/alone-{k:05d}")[1] for k in range(args.rounds)]
        rounds = []
        end = time.monotonic() + args.budget_s
        for k in range(args.rounds):
            if time.monotonic() > end:
                break
            rounds.append(_round(clients, f"s3race/raced-{time.time_ns()}-{k:05d}"))
    finally:
        server.stop()
    won = [t for r in rounds for what, t in r if what == "won"]
    lost = [t for r in rounds for what, t in r if what == "lost"]
    other = sorted({what for r in rounds for what, _ in r} - {"won", "lost"})
    winners = [sum(what == "won" for what, _ in r) for r in rounds]
    held = sum(max(t for _, t in r) >= 0.5 for r in rounds)
    result = {
        "command": command("s3race"), "server": "SeaweedFS",
        "writers": args.writers, "rounds": len(rounds),
        "alone": _summary(alone), "won": _summary(won), "lost": _summary(lost),
        "rounds_with_an_answer_of_500ms_or_more": held,
        "rounds_without_exactly_one_winner": sum(w != 1 for w in winners),
        "other_answers": other,
        "raw_seconds": [[[what, round(t, 4)] for what, t in r] for r in rounds],
    }
    save("s3race.json", result)
    for name in ("alone", "won", "lost"):
        s = result[name]
        print(f"{name:6} n {s['n']:4}  p50 {s['p50_ms']:8.1f}  p99 {s['p99_ms']:8.1f}  "
              f"max {s['max_ms']:8.1f} ms")
    print(f"{held} of {len(rounds)} rounds of {args.writers} racing writers had an answer "
          f"of 0.5 s or more; rounds without exactly one winner: "
          f"{result['rounds_without_exactly_one_winner']}; other answers: {other or 'none'}")


if __name__ == "__main__":
    main()
