"""A cache build kept in a bucket as it goes, so that an interrupted build resumes from the bucket on any machine.

`build_token_cache(..., mirror=URL)` builds in its local partial folder as always (`cache.py`), and a
`BuildMirror` keeps the bucket prefix `URL` in step with it: the build's key (`build.json`) first, then each
shard as soon as it is finished, its files before its completion record. A build that starts with the same key
at `URL` first copies the finished shards it lacks from the bucket into its partial folder, where the ordinary
resume skips them; with another key (or none) the prefix is emptied and the build starts afresh.

The bucket's copy counts as a cache only once its marker is there (`tradewind.core.buckets`): the caller copies
the finished cache with `upload_folder`, which sends only what the bucket lacks (the tokenizer copy, the
manifest) and the marker last. A build interrupted after its key left the bucket but before the marker landed
is rebuilt by the next one, unless its finished local folder is still there to be uploaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tradewind.core import read_json
from tradewind.core.buckets import download_files, list_objects, read_objects, remove_objects, upload_files
from tradewind.data.shards import RECORDS_DIR, ShardRecord, ShardTask, shard_files

BUILD_KEY = "build.json"  # in a partial build, local or mirrored: what it builds (only the same build resumes it)


class BuildMirror:
    """The bucket prefix `url` that mirrors the partial build in `partial`, keyed by `key`.

    Opening it brings into `partial` the finished shards of a mirrored build with the same key (those `partial`
    lacks); otherwise it empties the prefix and writes the key there. `partial` must hold the key already.
    """

    def __init__(self, url: str, partial: Path, key: dict[str, Any]):
        self.url, self.partial = url, partial
        held = read_objects(url, (BUILD_KEY,)).get(BUILD_KEY)
        if held is None or json.loads(held) != key:
            remove_objects(url)  # another build's shards, or a copy cut off part-way: none of them are this build's
            upload_files(partial, url, (BUILD_KEY,))
            self.held: set[str] = set()
            return
        records = [name for name in list_objects(url) if name.startswith(f"{RECORDS_DIR}/") and name.endswith(".json")]
        for name in records:
            if not (partial / name).exists():
                record = ShardRecord.model_validate_json(read_objects(url, (name,))[name])
                download_files(url, partial, shard_files(record))
        self.held = set(records)

    def keep(self, task: ShardTask) -> None:
        """Copy finished shard `task` to the bucket, its record last, unless the bucket has it."""
        name = task.record_path.relative_to(self.partial).as_posix()
        if name not in self.held:
            upload_files(self.partial, self.url, shard_files(ShardRecord.model_validate(read_json(task.record_path))))
            self.held.add(name)

    def finish(self) -> None:
        """Take the build's key out of the bucket, as the finished build leaves its partial folder."""
        remove_objects(f"{self.url}/{BUILD_KEY}")
