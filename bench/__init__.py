"""The benchmarks: Lakestream measured alone and beside the systems a user would pick instead.

Each benchmark is a module run from the repository's root, ``.venv/bin/python -m bench.<name>``
(``.venv-bench/bin/python`` where it needs the peers ``bench/setup-env`` installs); it writes
its JSON (and plots) to ``bench/results/``, from which ``python -m bench.report`` writes
BENCHMARKS.md. The servers they share with the tests live in ``tests/``: ``tests/s3server.py``
(SeaweedFS on 127.0.0.1) and ``tests/faultproxy.py`` (an HTTP proxy answering faults).
"""
