"""A run mirrored to object storage (any fsspec URI; ``s3://`` through s3fs): where things
live in the store (:mod:`.layout`), the store itself (:mod:`.store`), and reading a run back
from it (:mod:`.restore`). Torch-free; fsspec is imported only when a URI is opened.

The writer is ``ilab-watch DIR --mirror URI`` (``watcher/mirror/``); ``ilab-train
--restore-from URI`` reads (docs/mirror.md).
"""
