"""What an S3 client failure is in Lakestream's errors: the mapping of obstore's exceptions
and S3's replies (status, error code, the body's message) to the typed errors, each naming
its cause and what to do (``store/s3.py`` is the client)."""

from __future__ import annotations

import re
from xml.sax.saxutils import unescape

from obstore.exceptions import AlreadyExistsError as _ObAlreadyExists
from obstore.exceptions import NotFoundError as _ObNotFound
from obstore.exceptions import PermissionDeniedError as _ObDenied
from obstore.exceptions import PreconditionError as _ObPrecondition
from obstore.exceptions import UnauthenticatedError as _ObUnauthenticated

from lakestream.errors import (
    AlreadyExistsError,
    LakestreamError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
)


def s3_error(what: str, where: str, bucket: str, e: Exception) -> LakestreamError:
    """The error of ours that a client failure of ``what`` (``"reading"``, ...) on
    ``where`` is: it names the cause, what to do, and the S3 error code the body gave.

    A refusal is definite (PermissionDeniedError), whether the store did not accept the
    credentials, no credentials were found, or they may not do this; so is a missing bucket
    (NotFoundError). Only what may have happened is a StoreError.
    """
    reply = Reply.of(e)
    if reply.conflict:
        # obstore reports S3's 409 ConditionalRequestConflict ("a conflicting conditional
        # write is in flight: try again") as AlreadyExists. Nothing says the object exists:
        # taken as a 412, a fragment whose PUT never reached the server was committed. It
        # is a transient failure.
        return StoreError(f"{what} {where} met a conflicting write in flight (409)")
    if isinstance(e, (_ObAlreadyExists, _ObPrecondition)):
        return AlreadyExistsError(f"{where} already exists")
    if _METADATA_SERVICE.search(reply.text):
        return PermissionDeniedError(
            f"{what} {where}: no S3 credentials were found. Neither the storage options nor "
            "the environment set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, no AWS_PROFILE "
            "or ~/.aws/credentials gave any, and no instance or container role answered "
            f"({reply.summary}). Export the keys in the environment, or set AWS_PROFILE to a "
            "profile of ~/.aws/credentials (docs/deployment.md, Credentials)")
    if reply.code == "NoSuchBucket":
        return NotFoundError(
            f"{what} {where}: the bucket {bucket!r} does not exist (S3 NoSuchBucket): "
            "create it, or correct the bucket in the URI")
    if isinstance(e, (_ObNotFound, FileNotFoundError)):
        return NotFoundError(f"{where} does not exist")
    if reply.code in _AUTHENTICATION or isinstance(e, _ObUnauthenticated) \
            or reply.status == 401:
        fix = _AUTHENTICATION.get(reply.code or "", "check AWS_ACCESS_KEY_ID and "
                                  "AWS_SECRET_ACCESS_KEY")
        return PermissionDeniedError(
            f"{what} {where} was refused: the store did not accept the credentials "
            f"({reply.summary}); {fix}. They come from the storage options, else the AWS_* "
            "environment, else an AWS profile (docs/deployment.md, Credentials)")
    if isinstance(e, _ObDenied) or reply.status == 403 or reply.code == "AccessDenied":
        if reply.code is None:  # a HEAD's reply has no body to tell why
            return PermissionDeniedError(
                f"{what} {where} was refused ({reply.summary}, with no S3 error code): "
                "either the store did not accept the credentials or they may not do this; "
                "check the keys, then the policy (docs/deployment.md, Least privilege)")
        return PermissionDeniedError(
            f"{what} {where} was refused: the credentials may not do this "
            f"({reply.summary}); grant it (docs/deployment.md, Least privilege)")
    silent = _NO_ANSWER.search(reply.text) if reply.status is None else None
    if silent is not None:
        url = re.search(r"Error performing [A-Z]+ (\w+://[^/\s]+)", reply.text)
        tries = re.search(r"after (\d+) retries", reply.text)
        return StoreError(
            f"{what} {where} failed: no answer from "
            f"{url.group(1) if url else 'the S3 endpoint'}"
            f"{f' after {tries.group(1)} retries' if tries else ''} ({silent.group(0)}): "
            "check the endpoint (AWS_ENDPOINT_URL): the host and port of a running S3 server "
            "this machine can reach, and http:// or https:// as that server speaks (https:// "
            "to a plain-HTTP server gets no answer either); for AWS itself, leave it unset")
    return StoreError(f"{what} {where} failed: {reply.summary}")


_NO_ANSWER = re.compile(r"error sending request|connection refused|dns error|"
                        r"tcp connect error|connection reset|operation timed out", re.I)
"""What the client says when the endpoint gave no HTTP answer at all."""

_AUTHENTICATION = {
    "SignatureDoesNotMatch": "the secret key is not the one of this access key id: check "
                             "AWS_SECRET_ACCESS_KEY",
    "InvalidAccessKeyId": "the store knows no such access key id: check AWS_ACCESS_KEY_ID, "
                          "and that AWS_ENDPOINT_URL names the store that issued it",
    "InvalidClientTokenId": "the store knows no such access key id: check AWS_ACCESS_KEY_ID",
    "ExpiredToken": "the session token has expired: get fresh credentials (aws sso login, "
                    "or a new AWS_SESSION_TOKEN)",
    "TokenRefreshRequired": "the session token must be refreshed: get fresh credentials",
    "InvalidToken": "the session token is malformed or not of these keys: check "
                    "AWS_SESSION_TOKEN",
    "RequestTimeTooSkewed": "this machine's clock is more than 15 minutes off the store's: "
                            "synchronise it (NTP)",
    "AuthorizationHeaderMalformed": "the request was signed for another region: check "
                                    "AWS_REGION",
}
"""S3 error codes that say the request's credentials were not accepted, and the fix."""

_METADATA_SERVICE = re.compile(r"169\.254\.169\.254|169\.254\.170\.2|\[?fd00:ec2::254|"
                               r"/latest/api/token|/latest/meta-data/")
"""The instance metadata service the client asks for credentials when none are given."""


class Reply:
    """What a client failure says: the HTTP status, the S3 error code and message of the
    body, and a one-line summary with them (the body's first line is only ``<?xml?>``)."""

    def __init__(self, text: str, status: int | None, code: str | None,
                 message: str | None) -> None:
        self.text, self.status, self.code, self.message = text, status, code, message

    @classmethod
    def of(cls, e: BaseException) -> Reply:
        text = str(e)
        status = re.search(r"status code: (\d{3})", text)
        # An S3 error body, or a DeleteObjects failure: "...: Access Denied. (code: ...)".
        body = re.search(r"<Code>([^<]{1,100})</Code>", text)
        listed = re.search(r"failed for key [^\n]*?: ([^\n]{0,300}) \(code: (\w{1,100})\)", text)
        message = re.search(r"<Message>([^<]{0,300})</Message>", text)
        code = unescape(body.group(1)) if body else listed.group(2) if listed else None
        said = unescape(message.group(1)) if message else listed.group(1) if listed else None
        return cls(text, int(status.group(1)) if status else None, code, said)

    @property
    def conflict(self) -> bool:
        """S3's 409 ConditionalRequestConflict: a conditional write of the key in flight."""
        return self.code == "ConditionalRequestConflict" or self.status == 409 \
            or "409 Conflict" in self.text

    @property
    def summary(self) -> str:
        """``PUT <url>: 403 Forbidden: S3 <Code>: <Message>``, or the first line of what the
        client said where it got no HTTP answer."""
        request = re.search(r"Error performing ([A-Z]+ \S+)", self.text)
        status = re.search(r"status code: (\d{3}[^:\n]*)(?::\s*([^\n]*))?", self.text)
        if request is None or status is None:
            return self.text.strip().split("\n", 1)[0][:300]
        said = f"{request.group(1)}: {status.group(1).strip()}"
        body = (status.group(2) or "").strip()
        if self.code is not None:
            said += f": S3 {self.code}" + (f": {self.message}" if self.message else "")
        elif body and not body.startswith("<"):
            said += f": {body[:200]}"
        return said


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.split("\n", 1)[0][:300]
