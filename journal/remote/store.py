"""A mirror's store: one fsspec filesystem and a root inside it.

Credentials and the endpoint come only from where the storage client looks for them itself
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws/config``, instance roles for S3): a
URI that carries a secret is refused in one line (:func:`check_uri`), so none can reach a
record, a log or a console line through the URI.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any
from urllib.parse import unquote, urlsplit

# StoreURIError is re-exported: the mirror's and the restore's callers import it from here
from journal.remote.errors import StoreURIError as StoreURIError
from journal.remote.errors import classify

#: Names of URI parameters (query, fragment, ``;`` path parameters) that would carry a
#: credential: any of these in a name refuses the URI.
_SECRET_NAME = re.compile(
    r"secret|key|token|pass|pwd|signature|credential|auth|session|^sig$|^sas$", re.I
)
#: A parameter's name anywhere after the authority: ``?name=``, ``&name=``, ``#name=``, ``;name=``.
_PARAM_NAME = re.compile(r"[?&#;]([^=?&#;/]*)=")
#: s3: fail fast on a dead store (the mirror retries itself, on its own schedule).
READ_TIMEOUT_S = 60.0
_S3_CONFIG = {"connect_timeout": 5, "retries": {"max_attempts": 2}}

#: ``ilab-train --restore-from``'s help (here: its field's module is at its size limit).
RESTORE_FROM_HELP = (
    "A store URI that ilab-watch --mirror fills (s3://bucket/run, any fsspec URI): a launch "
    "whose checkpoint dir holds no journal first fetches the mirrored journal and the newest "
    "checkpoint with its completion marker, then resumes it. Credentials from the "
    "environment or config files, never the URI."
)


def is_uri(text: str) -> bool:
    """Whether ``text`` names a store (``scheme://...``) rather than a local directory."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", text))


def _decoded(text: str) -> str:
    """``text`` with its percent-escapes undone until none is left (``p%61ss`` is ``pass``,
    ``%2561`` is ``a`` encoded twice): each round shortens it, so this ends."""
    while (plain := unquote(text)) != text:
        text = plain
    return text


def credential_in(uri: str) -> str | None:
    """What in ``uri`` looks like a credential (``user:secret@``, a ``secret``, ``key``,
    ``token``, ``pass``, ``signature``... parameter in its query, fragment or path), in words
    that do not repeat it; None when nothing does. The one place that decides it: on the
    text decoded first (:func:`_decoded`), so no percent-encoding hides a name, an ``=``,
    a ``?`` or an ``@``; text that is no URI is searched whole."""
    plain = _decoded(uri)
    after = plain
    if is_uri(plain):
        parts = urlsplit(plain)
        if "@" in parts.netloc:
            return "credentials in it"
        after = plain[len(parts.scheme) + 3 + len(parts.netloc) :]
    elif "@" in plain.partition("/")[0]:
        return "credentials in it"
    if any(_SECRET_NAME.search(name) for name in _PARAM_NAME.findall(after)):
        return "a credential parameter"
    return None


def check_uri(uri: str) -> str:
    """``uri`` without a trailing slash; raises :class:`StoreURIError` for one that holds a
    credential (:func:`credential_in`) or is no URI. The message never repeats the secret
    (a credential is looked for first: text that is no URI is repeated only without one)."""
    if (what := credential_in(uri)) is not None:
        scheme = f"{urlsplit(uri).scheme}:// " if is_uri(uri) else ""
        raise StoreURIError(
            f"refusing a {scheme}URI with {what}: give keys through the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a config file"
        )
    if not is_uri(uri):
        raise StoreURIError(f"{uri!r} is not a store URI (scheme://bucket/prefix)")
    scheme = urlsplit(uri).scheme
    if scheme == "s3" and len(urlsplit(uri).netloc) < 3:
        raise StoreURIError(f"{uri!r}: an S3 bucket name has 3 characters or more")
    return uri.rstrip("/")


class TooLarge(ValueError):
    """An object in the store larger than its reader takes: refused without being read."""


class Store:
    """Keys (``journal/...``, ``checkpoints/step-000010/...``) under one URI's root.

    Every read of an object states the most it takes (``limit``): whoever can write the
    store must not be able to make a reader hold a huge object in memory. A local
    filesystem (``file://``) gets its directories made as keys are written."""

    def __init__(self, uri: str, *, read_timeout: float = READ_TIMEOUT_S) -> None:
        import fsspec

        self.uri = check_uri(uri)
        self.protocol = urlsplit(self.uri).scheme
        options: dict[str, Any] = {}
        if self.protocol in ("s3", "s3a"):
            # no instance cache: a retry after a dead store must get a fresh connection pool
            config = {**_S3_CONFIG, "read_timeout": read_timeout}
            options = {"config_kwargs": config, "skip_instance_cache": True}
        elif self.protocol in _LOCAL:
            options = {"auto_mkdir": True}  # a key's directories are made as it is written
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.uri, **options)
        except ImportError as exc:  # s3fs (the `s3` extra) not installed
            raise StoreURIError(f"{self.protocol}:// needs a package: {exc}") from None
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

    def check(self) -> None:
        """Ask the store whether this URI can be used at all, with one small request: an S3
        bucket that does not exist, an invalid bucket name, unknown keys or a refusal raise
        the client's error (:func:`journal.remote.errors.classify` says which); an empty
        prefix is fine. A local root that is a file raises :class:`StoreURIError`."""
        if self.protocol in ("s3", "s3a"):
            from fsspec.asyn import sync

            bucket, _, prefix = self.root.partition("/")
            sync(
                self.fs.loop,
                self.fs._call_s3,
                "list_objects_v2",
                Bucket=bucket,
                Prefix=f"{prefix}/" if prefix else "",
                MaxKeys=1,
            )
        elif self.protocol in _LOCAL:
            if self.fs.exists(self.root) and not self.fs.isdir(self.root):
                raise StoreURIError(f"{self.uri}: not a directory")
        else:
            self.listing("")

    def listing(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` (recursively): key -> size; {} when none. A store
        that refuses (no such bucket, ...) raises, never reads as empty."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.path(prefix), detail=True)
        except FileNotFoundError as exc:
            if classify(exc).permanent:  # s3fs: a missing bucket is a FileNotFoundError
                raise
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

    def get_bytes(self, key: str, limit: int) -> bytes:
        """An object's bytes, ``limit`` at most: a larger one raises :class:`TooLarge`
        after reading only ``limit + 1`` bytes of it."""
        data = bytes(self.fs.cat_file(self.path(key), start=0, end=limit + 1))
        if len(data) > limit:
            raise TooLarge(f"{self.url(key)}: larger than the {_size(limit)} a reader takes")
        return data

    def head(self, key: str, size: int) -> bytes:
        """An object's first ``size`` bytes (all of a smaller one)."""
        return bytes(self.fs.cat_file(self.path(key), start=0, end=size))

    def put_files(self, pairs: list[tuple[str, str]]) -> None:
        """Upload local files (local path, key) at once: s3fs runs them concurrently, large
        ones as parallel multipart uploads."""
        if pairs:
            self.fs.put([lp for lp, _ in pairs], [self.path(k) for _, k in pairs])

    def get_files(self, pairs: list[tuple[str, str]]) -> None:
        """Download (key, local path) pairs at once."""
        if pairs:
            self.fs.get([self.path(k) for k, _ in pairs], [lp for _, lp in pairs])

    def move(self, key: str, to: str) -> None:
        """Move one object (S3: a copy in the store, then a delete; never read here)."""
        self.fs.mv(self.path(key), self.path(to))
        self._tidy([key])

    def delete(self, keys: list[str]) -> None:
        if keys:
            self.fs.rm([self.path(k) for k in keys])
            self._tidy(keys)

    def _tidy(self, keys: list[str]) -> None:
        """A local store: the directories its deletes left empty go too (an object store
        has no directories to leave)."""
        if self.protocol not in _LOCAL:
            return
        for key in keys:
            parent = posixpath.dirname(self.path(key))
            while parent.startswith(self.root + "/"):
                try:
                    os.rmdir(parent)
                except OSError:  # not empty (or gone): the rest above stays too
                    break
                parent = posixpath.dirname(parent)


#: fsspec's names for this machine's filesystem.
_LOCAL = ("file", "local")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
