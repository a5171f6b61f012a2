"""`gcp-storage-emulator start ...`, answering downloads with the generation headers real Cloud Storage sends, and
queueing as many connections as tensorstore opens at once.

Cloud Storage answers every object download with `x-goog-generation` and `x-goog-metageneration`
(https://cloud.google.com/storage/docs/xml-api/reference-headers). Tensorstore, which writes orbax's checkpoints,
reads the generation to make its conditional writes and refuses a response without it ("Malformed
StorageGeneration"). The emulator (2026.7.19) leaves both out; this script adds them, then starts the emulator as
its own command line does (`python tests/gcs_emulator.py start --host ... --port ...`).
"""

import sys
from http.server import HTTPServer

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

emulator_download = objects.download


def download(request, response, storage, *args, **kwargs):
    emulator_download(request, response, storage, *args, **kwargs)
    try:
        found = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        return
    response["x-goog-generation"] = found["generation"]
    response["x-goog-metageneration"] = found["metageneration"]


objects.download = download  # what `objects.get` calls for `alt=media`
for _, methods in server.HANDLERS:
    for method, handler in methods.items():
        if handler is emulator_download:
            methods[method] = download

# The emulator answers one request at a time, and its socket queues Python's default 5 connections. Tensorstore
# opens more at once; the kernel drops the rest, and their clients try again only a second or more later.
HTTPServer.request_queue_size = 128

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
