"""Folders copied to and from buckets: complete or absent, against real servers on loopback (see bucket_servers)."""

import os
import subprocess
import sys

import pytest
from bucket_servers import BIN, free_port, start, stop

from tradewind.core import ConfigError, NotFoundError
from tradewind.core.buckets import MARKER, check_access, download_folder, is_complete, remote_fs, upload_folder


def make_folder(root, files):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


FILES = {"manifest.json": b'{"a": 1}', "train/shard-00000.bin": bytes(range(256)) * 40, "val/x.npy": b"\x00" * 7}


def test_a_folder_copied_up_and_down_comes_back_byte_for_byte(bucket, tmp_path):
    source = make_folder(tmp_path / "source", FILES)
    seen = []
    upload_folder(source, f"{bucket}/cache", progress=lambda done, total: seen.append((done, total)))
    assert is_complete(f"{bucket}/cache")
    assert seen[-1] == (sum(map(len, FILES.values())),) * 2

    copy = download_folder(f"{bucket}/cache", tmp_path / "copy")
    assert {p.relative_to(copy).as_posix(): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == FILES

    (tmp_path / "empty").mkdir()  # a pipeline step may write nothing: its copy is the marker alone
    upload_folder(tmp_path / "empty", f"{bucket}/empty")
    assert list(download_folder(f"{bucket}/empty", tmp_path / "empty-copy").iterdir()) == []


def test_an_upload_cut_off_part_way_is_never_read_and_the_next_one_finishes_it(bucket, tmp_path):
    source = make_folder(tmp_path / "source", FILES)

    def cut_off(done, total):
        raise KeyboardInterrupt("killed after the first file")

    with pytest.raises(KeyboardInterrupt):
        upload_folder(source, f"{bucket}/cache", progress=cut_off)
    fs, path = remote_fs(f"{bucket}/cache")
    assert fs.find(path), "the first file was sent"
    assert not is_complete(f"{bucket}/cache")
    with pytest.raises(NotFoundError, match=rf"holds no complete copy \({MARKER} missing"):
        download_folder(f"{bucket}/cache", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()

    upload_folder(source, f"{bucket}/cache")
    assert download_folder(f"{bucket}/cache", tmp_path / "copy").joinpath("val/x.npy").read_bytes() == b"\x00" * 7


def test_a_file_changed_after_its_copy_was_marked_is_refused_on_download(bucket, tmp_path):
    upload_folder(make_folder(tmp_path / "source", FILES), f"{bucket}/cache")
    fs, path = remote_fs(f"{bucket}/cache")
    fs.pipe_file(f"{path}/val/x.npy", b"longer than it was")
    with pytest.raises(ConfigError, match=r"val/x\.npy: 18 bytes, its copy's marker says 7"):
        download_folder(f"{bucket}/cache", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_a_bucket_that_does_not_exist_fails_the_access_check_naming_it_and_how_to_log_in(bucket):
    scheme = bucket.split("://")[0]
    missing = f"{scheme}://tw-no-such-bucket-{abs(hash(bucket)) % 10**6}/x"
    how = "application-default" if scheme == "gs" else "AWS credential chain"
    with pytest.raises(ConfigError, match=rf"argument 'storage': cannot use {missing}: .*{how}"):
        check_access(missing, argument="storage")
    check_access(bucket, argument="storage")


def access_check_in_a_fresh_process(url: str, env: dict[str, str]) -> str:
    """What `check_access(url)` prints failing in a fresh process with `env` (no client made earlier holds
    credentials there)."""
    code = f"from tradewind.core.buckets import check_access; check_access('{url}', argument='storage')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    return done.stderr


def test_missing_s3_credentials_fail_the_access_check_naming_the_url_and_the_aws_chain(s3_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_ENDPOINT_URL"}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # nothing beyond loopback: no instance-role lookup
    printed = access_check_in_a_fresh_process(f"{s3_server}/x", env)
    assert f"ConfigError: argument 'storage': cannot use {s3_server}/x: " in printed
    assert "AWS credential chain: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in printed


def test_wrong_s3_credentials_fail_the_access_check_with_what_the_server_said(tmp_path):
    # A moto server that checks keys against its IAM users (it has none) after its first request, which makes
    # the bucket: so the bucket exists and only the key is wrong. (gcp-storage-emulator checks no credentials.)
    port = free_port()
    server = start(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        port,
        "moto_server",
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "1"},
    )
    endpoint = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1"}
    env = {**os.environ, **endpoint, "AWS_ACCESS_KEY_ID": "not-a-key", "AWS_SECRET_ACCESS_KEY": "not-a-secret"}
    try:
        code = "import boto3; boto3.client('s3').create_bucket(Bucket='tw-keys')"  # one request
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
        printed = access_check_in_a_fresh_process("s3://tw-keys/x", env)
    finally:
        stop(server)
    assert "cannot use s3://tw-keys/x: The AWS Access Key Id you provided does not exist in our records. " in printed
    assert "AWS credential chain" in printed
