"""A mirror's store: one fsspec filesystem and a root inside it.

Credentials and the endpoint come only from where the storage client looks for them itself
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws/config``, instance roles for S3): a
URI that carries a secret is refused in one line (:func:`check_uri`), so none can reach a
record, a log or a console line through the URI.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: Query parameters that would put a credential into the URI.
_SECRET_PARAM = re.compile(r"(secret|key|token|password|passwd|signature|credential|sig$)", re.I)
#: s3: fail fast on a dead store (the mirror retries itself, on its own schedule).
_S3_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}

#: ``ilab-train --restore-from``'s help (here: its field's module is at its size limit).
RESTORE_FROM_HELP = (
    "A store URI that ilab-watch --mirror fills (s3://bucket/run, any fsspec URI): a launch "
    "whose checkpoint dir holds no journal first fetches the mirrored journal and the newest "
    "checkpoint with its completion marker, then resumes it. Credentials from the "
    "environment or config files, never the URI."
)


class StoreURIError(ValueError):
    """A URI the mirror refuses (one line for the user)."""


def is_uri(text: str) -> bool:
    """Whether ``text`` names a store (``scheme://...``) rather than a local directory."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", text))


def check_uri(uri: str) -> str:
    """``uri`` without a trailing slash; raises :class:`StoreURIError` for one that holds a
    credential (``user:secret@`` or a key/token/signature parameter) or is no URI. The
    message never repeats the secret."""
    if not is_uri(uri):
        raise StoreURIError(f"{uri!r} is not a store URI (scheme://bucket/prefix)")
    parts = urlsplit(uri)
    if "@" in parts.netloc:
        raise StoreURIError(
            f"refusing a {parts.scheme}:// URI with credentials in it: give keys through the "
            "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a config file"
        )
    if any(_SECRET_PARAM.search(k) for k, _ in parse_qsl(parts.query, keep_blank_values=True)):
        raise StoreURIError(
            f"refusing a {parts.scheme}:// URI with a credential parameter: give keys through "
            "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a config file"
        )
    if parts.scheme == "s3" and len(parts.netloc) < 3:
        raise StoreURIError(f"{uri!r}: an S3 bucket name has 3 characters or more")
    return uri.rstrip("/")


class Store:
    """Keys (``journal/...``, ``checkpoints/step-000010/...``) under one URI's root."""

    def __init__(self, uri: str) -> None:
        import fsspec

        self.uri = check_uri(uri)
        protocol = urlsplit(self.uri).scheme
        options: dict[str, Any] = {}
        if protocol in ("s3", "s3a"):
            # no instance cache: a retry after a dead store must get a fresh connection pool
            options = {"config_kwargs": dict(_S3_CONFIG), "skip_instance_cache": True}
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.uri, **options)
        except ImportError as exc:  # s3fs (the `s3` extra) not installed
            raise StoreURIError(f"{protocol}:// needs a package: {exc}") from None
        except ValueError as exc:
            raise StoreURIError(f"{self.uri}: {exc}") from None
        self.root = self.root.rstrip("/")

    def path(self, key: str) -> str:
        return posixpath.join(self.root, key) if key else self.root

    def url(self, key: str) -> str:
        """The URI of a key, for people and callbacks."""
        return f"{self.uri}/{key}" if key else self.uri

    def _key(self, path: str) -> str:
        path = path.rstrip("/")
        return path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path

    def listing(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` (recursively): key -> size; {} when none."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.path(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {
            self._key(p): int(info.get("size") or 0)
            for p, info in found.items()
            if info.get("type") != "directory"
        }

    def exists(self, key: str) -> bool:
        self.fs.invalidate_cache()
        return bool(self.fs.exists(self.path(key)))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(key), data)

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(key)))

    def put_files(self, pairs: list[tuple[str, str]]) -> None:
        """Upload local files (local path, key) at once: s3fs runs them concurrently, large
        ones as parallel multipart uploads."""
        if pairs:
            self.fs.put([lp for lp, _ in pairs], [self.path(k) for _, k in pairs])

    def get_files(self, pairs: list[tuple[str, str]]) -> None:
        """Download (key, local path) pairs at once."""
        if pairs:
            self.fs.get([self.path(k) for k, _ in pairs], [lp for _, lp in pairs])

    def delete(self, keys: list[str]) -> None:
        if keys:
            self.fs.rm([self.path(k) for k in keys])
