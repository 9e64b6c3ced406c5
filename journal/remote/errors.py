"""What a store's error means, decided in this one place: whether waiting can fix it.

- ``TRANSIENT``: the store does not answer now (connection refused or reset, a timeout,
  a 5xx answer, throttling). Waiting and retrying is right: the mirror keeps its leases
  and catches up when the store is back.
- ``PERMANENT``: the store answers, and the answer is no (no such bucket, an invalid
  bucket name, unknown key, a signature that does not match, access denied, an expired
  token, a request it refuses as invalid). Retrying cannot help; someone must change the
  URI or the credentials. At start: one line, exit 2. Mid-run: the mirror stops with one
  line and lets go of its leases, so training rotates as if no mirror ran.
- ``LOCAL``: this machine's own files, not the store (no space left on device, a file
  gone). Said as such, and retried: space may be freed. (A local permission denied or
  read-only filesystem is permanent, and said as this machine's: ``Problem.local``.)

The client libraries (botocore through s3fs, aiohttp, asyncio) are never imported here: an
exception of theirs can exist only once they are loaded, so their classes are looked up
in ``sys.modules``.
"""

from __future__ import annotations

import enum
import errno
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class StoreURIError(ValueError):
    """A URI the mirror refuses (one line for the user)."""


class Kind(enum.Enum):
    """Whether waiting can fix an error (see the module docstring)."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    LOCAL = "local"


@dataclass(frozen=True)
class Problem:
    """An error's kind and its cause in one line, fit for the console; ``local`` when it
    came from this machine's files (a denied or full disk), not from the store."""

    kind: Kind
    cause: str
    local: bool = False

    @property
    def permanent(self) -> bool:
        return self.kind is Kind.PERMANENT


#: S3 error codes that no retry can fix, and what each means to the user.
_PERMANENT_CODES = {
    "NoSuchBucket": "no such bucket",
    "InvalidBucketName": "invalid bucket name",
    "InvalidAccessKeyId": "the store does not know the access key (AWS_ACCESS_KEY_ID)",
    "SignatureDoesNotMatch": (
        "wrong credentials: the signature does not match (AWS_SECRET_ACCESS_KEY)"
    ),
    "AccessDenied": "access denied",
    "AllAccessDisabled": "access denied (all access to this bucket is disabled)",
    "AccountProblem": "access denied (a problem with the account)",
    "ExpiredToken": "the session token has expired (AWS_SESSION_TOKEN)",
    "InvalidToken": "the session token is invalid (AWS_SESSION_TOKEN)",
    "TokenRefreshRequired": "the session token has expired (AWS_SESSION_TOKEN)",
    "RequestTimeTooSkewed": "this machine's clock differs too much from the store's",
}
#: 4xx codes that waiting does fix (everything else 4xx is permanent).
_TRANSIENT_CODES = {
    "RequestTimeout",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "OperationAborted",
    "NoSuchKey",  # listed, then gone: the next pass sees the store as it is now
    "404",  # a HEAD's bare answer for a key that is gone
    "NotFound",
    "NoSuchUpload",
    "PreconditionFailed",
}
#: Local errnos that say the disk cannot take more (space may come back).
_FULL = {errno.ENOSPC, errno.EDQUOT}
#: Local errnos that no retry fixes.
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def classify(exc: BaseException) -> Problem:
    """What ``exc`` (raised by a store's client, or by this machine's files while moving a
    store's data) means: its :class:`Kind` and a one-line cause."""
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, StoreURIError):
            return Problem(Kind.PERMANENT, _first_line(e))
    for e in chain:  # the store's answer, where there was one
        response = getattr(e, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            return _from_answer(response)
    botocore = sys.modules.get("botocore.exceptions")
    for e in chain:
        if botocore is not None and isinstance(e, botocore.ParamValidationError):
            # botocore refused the request before sending it (a bucket name with ':')
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            return Problem(Kind.PERMANENT, f"invalid request: {lines[-1] if lines else e}")
        if botocore is not None and isinstance(
            e, (botocore.NoCredentialsError, botocore.PartialCredentialsError)
        ):
            return Problem(
                Kind.PERMANENT,
                f"no usable credentials ({_first_line(e)}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or a profile",
            )
    for e in chain:
        if _is_network(e, botocore):
            return Problem(Kind.TRANSIENT, _first_line(e))
    for e in chain:
        if isinstance(e, OSError) and e.errno is not None:
            where = f": {e.filename}" if e.filename else ""
            text = f"{e.strerror or _first_line(e)}{where}"
            if e.errno in _DENIED:
                return Problem(Kind.PERMANENT, text, local=True)
            return Problem(Kind.LOCAL, text, local=True)
    return Problem(Kind.TRANSIENT, _first_line(exc))


def _from_answer(response: dict[str, Any]) -> Problem:
    error = response["Error"]
    code = str(error.get("Code") or "")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    message = str(error.get("Message") or "").strip()
    said = f"{code}: {message}" if message and message != code else code
    if code in _PERMANENT_CODES:
        return Problem(Kind.PERMANENT, f"{_PERMANENT_CODES[code]} ({said})")
    if code in ("403", "Forbidden"):
        return Problem(Kind.PERMANENT, f"access denied ({said})")
    if code in _TRANSIENT_CODES:
        return Problem(Kind.TRANSIENT, said)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return Problem(Kind.PERMANENT, f"the store refuses the request ({said})")
    return Problem(Kind.TRANSIENT, said)


def _is_network(e: BaseException, botocore: Any) -> bool:
    """No answer at all: refused, reset, timed out."""
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    asyncio = sys.modules.get("asyncio")  # its TimeoutError is another class before 3.11
    if asyncio is not None and isinstance(e, asyncio.TimeoutError):
        return True
    if botocore is not None and isinstance(e, (botocore.HTTPClientError, botocore.ConnectionError)):
        return True
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(e, aiohttp.ClientError)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (s3fs raises an OSError whose cause is the store's answer)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
