"""Writes RELIABILITY.md from the tally the reliability suite leaves in
bench/results/reliability.json (``make soak`` runs both)."""

from __future__ import annotations

import json
import platform
import sys

from bench.output import RESULTS, ROOT


def main() -> None:
    tally = json.loads((RESULTS / "reliability.json").read_text())
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else None
    t = tally.get
    faults = {k.split(".", 1)[1]: v for k, v in tally.items()
              if k.startswith("s3_faults_injected.")}
    crashes = {k.split(".", 1)[1]: v for k, v in tally.items() if k.startswith("crash_runs.")}
    corruption = {k.split(".", 1)[1]: v for k, v in tally.items()
                  if k.startswith("corruption.")}
    lines = [
        "# Reliability", "",
        "What `make soak` runs, and what its latest run found. `make test` runs the same",
        "tests on fewer seeds and trials. Written by `bench/reliability_report.py` from",
        "`bench/results/reliability.json`.", "",
        f"Machine: {platform.platform()}, Python {platform.python_version()}."
        + (f" Duration: {seconds / 60:.1f} minutes." if seconds else ""), "",
        "| check | figure |", "| --- | --- |",
        f"| samples checked against the history | {t('samples_checked', 0):,} |",
        f"| samples lost | {t('lost', 0)} |",
        f"| samples duplicated | {t('duplicated', 0)} |",
        f"| crash runs (real processes SIGKILLed at a failpoint, then restarted) | "
        f"{t('crash_runs', 0)} ({t('crash_kills', 0)} kills) |",
        f"| S3 faults injected (runs at 1%, 5%, 20%) | {t('s3_faults_injected', 0):,} in "
        f"{t('s3_fault_runs', 0)} runs |",
        f"| corruptions tried / named by `lakestream verify` | {t('corruptions_tried', 0):,} / "
        f"{t('corruptions_detected_by_verify', 0):,} (every changed object) |",
        f"| elastic resume cases / mismatches | {t('elastic_cases', 0)} / "
        f"{t('elastic_mismatches', 0)} |", ""]
    if crashes:
        lines += ["Crash runs by backend and failpoint: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(crashes.items())) + ".", ""]
    if faults:
        lines += ["Faults by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
                  + ". `lost-503` and `lost-timeout` reach the store and then lose the reply.",
                  ""]
    if corruption:
        lines += ["Corruptions by object, damage and what reading the stream did "
                  "(`read-failed`: a typed error naming the object; `read-intact`: the reader "
                  "never needed it, or fell back to an older snapshot, and got the original "
                  "data): " + ", ".join(f"{k} {v}" for k, v in sorted(corruption.items()))
                  + ".", ""]
    lines += [
        "## What the suite is", "",
        "- `tests/reliability/history.py`: a history of writes (ok, failed, unknown) and reads, "
        "checked afterwards: nothing acknowledged lost, nothing twice, failed writes absent, "
        "readers agree and never go back, versions gapless, per-producer seqs without gaps. "
        "`test_history.py` shows it catching each kind of violation.",
        "- `test_s3_faults.py`: 3 producers and a reader through an HTTP proxy in front of a "
        "SeaweedFS server, injecting 503, 500, 409, resets, lost replies and slow replies.",
        "- `tests/producers/test_crash.py`: 3 producer processes SIGKILLed at each failpoint, "
        "on the local store and on S3, then restarted until done.",
        "- `tests/producers/test_hostcommit.py`: 3 producer processes sharing their host's "
        "commits (`share_commits=\"host\"`), SIGKILLed at each failpoint and after leaving a "
        "run for the host's committer, whoever commits for the host among them, then restarted "
        "together (`host-` in the crash runs above).",
        "- `tests/producers/test_storeruns.py`: 2 hosts of 2 producer processes pooling their "
        "runs through the store (`share_commits=\"store\"`), SIGKILLed at each failpoint and "
        "after leaving the host's runs in the store for the other host's committer, then "
        "restarted together (`pool-` in the crash runs above).",
        "- `test_corruption_fuzz.py`: bit flips, truncations and emptied objects in log "
        "entries, snapshot manifests, index segments and fragments.",
        "- `test_model.py`: a hypothesis state machine (produce, crash, restart, lost ack, "
        "store fault, snapshot, marker, retain, gc, read) against a model.",
        "- `test_environment.py`: a store whose LIST and HEAD lag behind writes; producers and "
        "gc on clocks a day off.",
        "- `test_elastic.py`: every pair of world sizes dividing 24 x interrupt points "
        "{0, 1, middle, end} x 0 or 2 DataLoader workers.",
        "- `test_bad_inputs.py`: non-finite values where the schema forbids them, oversized "
        "samples, empty writes, and no unpickling of anything read from a store.", "",
        "## Bugs it found", "",
        "- A log entry or snapshot manifest that lost only its final newline parsed to the "
        "same content and passed its checksum (the checksum covered the parsed lines). Fixed: "
        "both must end with their newline; "
        "`test_an_entry_or_manifest_cut_at_its_last_newline_is_caught`.",
        "- Entries were split into lines with `str.splitlines()`, which also splits on `\\v`, "
        "`\\f` and `\\x1c`-`\\x1e`: a newline flipped to `\\v` parsed to the same lines and "
        "passed the checksum. Fixed: split on `\\n` alone, as Delta readers do; "
        "`test_every_single_bit_flip_of_every_entry_is_caught` tries them all.",
        "- Damage in bytes Parquet does not check (statistics, framing) of segments, "
        "manifests and fragments read as sound while the fuzz was being built; fixed by "
        "CRC-32s over whole objects.",
        "- A producer idle across a gc wrote its next snapshot naming an index segment gc had "
        "collected (its state named the segments of the manifest it last rebased on), and "
        "every opener failed on it (1 run in 30 of the S3 fault soak). Fixed: a writer checks "
        "the stored segments it names and puts one that is gone again from the columns it "
        "holds, and gc lists the manifests again after the segments; "
        "`tests/log/test_index.py::test_a_writer_idle_across_a_gc_never_names_a_collected_"
        "segment`.", ""]
    (ROOT / "RELIABILITY.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
