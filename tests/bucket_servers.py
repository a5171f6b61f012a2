"""Real bucket servers on loopback for the storage tests: `gcp-storage-emulator` for gs://, `moto` for s3://.

Each server is a child process started on a free 127.0.0.1 port and stopped when the session ends. The
clients find them through their documented endpoint settings, set in this process's environment so that the
training processes a test starts inherit them: `STORAGE_EMULATOR_HOST` (gcsfs), `TENSORSTORE_GCS_HTTP_URL`
(orbax's tensorstore), `AWS_ENDPOINT_URL` (s3fs and botocore).

With `TRADEWIND_TEST_GCS_BUCKET` / `TRADEWIND_TEST_S3_BUCKET` set (`bucket/prefix`), the same tests run against
that real bucket, with the environment's own credentials, instead; otherwise those cases are skipped, saying so.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# gcsfs asks Cloud Storage's control API (gRPC) whether a bucket is hierarchical, which no emulator answers:
# it would warn on every call. Set before gcsfs is first imported, here and in the processes tests start.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

BUCKET = "tw-test"
BIN = Path(sys.executable).parent
# Credentials for moto, which accepts any: planted so that a test can grep a run's files for them.
S3_SECRET = f"tw-planted-secret-{secrets.token_hex(8)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, name: str) -> None:
    """Return once `port` accepts connections; fail if the server exits or 30 s pass."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within 30 s")


def start(command: list[str], port: int, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wait_for_port(port, process, name)
    return process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_gcs_emulator() -> tuple[subprocess.Popen, str]:
    """A `gcp-storage-emulator` (bucket `tw-test`, in memory) and the gs:// URL of its bucket; the endpoint is set
    in this process's environment."""
    port = free_port()
    emulator = Path(__file__).with_name("gcs_emulator.py")  # with the download headers real GCS sends
    command = [sys.executable, str(emulator), "start", "--host", "127.0.0.1", "--port", str(port)]
    process = start([*command, "--in-memory", "--default-bucket", BUCKET], port, "gcp-storage-emulator")
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(STORAGE_EMULATOR_HOST=endpoint, TENSORSTORE_GCS_HTTP_URL=endpoint)
    return process, f"gs://{BUCKET}"


def start_s3_server() -> tuple[subprocess.Popen, str]:
    """A `moto` server with a bucket `tw-test` and the s3:// URL of it; the endpoint and planted credentials are
    set in this process's environment."""
    port = free_port()
    process = start([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port, "moto_server")
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="tw-test-key",
        AWS_SECRET_ACCESS_KEY=S3_SECRET,
        AWS_DEFAULT_REGION="us-east-1",
    )
    import fsspec

    fsspec.filesystem("s3").mkdir(BUCKET)
    return process, f"s3://{BUCKET}"


@pytest.fixture(scope="session")
def gcs_emulator():
    """A gs:// prefix on a `gcp-storage-emulator` server, for the session."""
    process, url = start_gcs_emulator()
    yield url
    stop(process)


@pytest.fixture(scope="session")
def s3_server():
    """An s3:// prefix on a `moto` server, with planted credentials, for the session."""
    process, url = start_s3_server()
    yield url
    stop(process)


BUCKET_KINDS = ["gcs-emulator", "s3-moto", "gcs-real", "s3-real"]
REAL_BUCKET_ENV = {"gcs-real": ("TRADEWIND_TEST_GCS_BUCKET", "gs"), "s3-real": ("TRADEWIND_TEST_S3_BUCKET", "s3")}


@pytest.fixture(params=BUCKET_KINDS)
def bucket(request) -> str:
    """A fresh, empty prefix in one kind of bucket: the two servers above, and real buckets when configured."""
    kind = request.param
    if kind in REAL_BUCKET_ENV:
        variable, scheme = REAL_BUCKET_ENV[kind]
        if not os.environ.get(variable):
            pytest.skip(f"{variable} is not set: no real {scheme}:// bucket to test against")
        root = f"{scheme}://{os.environ[variable].strip('/')}"
    else:
        root = request.getfixturevalue("gcs_emulator" if kind == "gcs-emulator" else "s3_server")
    return f"{root}/{request.node.name.split('[')[0][:40]}-{secrets.token_hex(3)}"
