"""What S3 failures say, against the real server: each names its cause, the fix and the S3
error code, and no secret shows in a message or a repr."""

from __future__ import annotations

import uuid

import pytest

import lakestream
from lakestream.errors import NotFoundError, PermissionDeniedError
from lakestream.store import open_store
from lakestream.store.s3 import S3Options
from tests.conftest import BUCKET
from tests.s3server import READER, ROLES_PREFIX, SeaweedS3

SECRET = "not-the-secret-0123456789"
_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                         "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL",
                         "AWS_ALLOW_HTTP", "AWS_WEB_IDENTITY_TOKEN_FILE",
                         "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                         "AWS_CONTAINER_CREDENTIALS_FULL_URI")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> pytest.MonkeyPatch:
    """No credentials in the environment, nor a credentials file."""
    for name in _CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    return monkeypatch


def _uri() -> str:
    return f"s3://{BUCKET}/errors-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("key, value, code, fix", [
    ("AWS_SECRET_ACCESS_KEY", SECRET, "SignatureDoesNotMatch", "check AWS_SECRET_ACCESS_KEY"),
    ("AWS_ACCESS_KEY_ID", "nobody-knows-me", "InvalidAccessKeyId", "check AWS_ACCESS_KEY_ID"),
])
def test_credentials_the_store_does_not_accept_are_an_authentication_failure(
        s3_options: dict[str, str], clean_env, key: str, value: str, code: str,
        fix: str) -> None:
    wrong = {**s3_options, key: value}
    store = open_store(_uri(), wrong)
    for attempt in (lambda: store.put("k", b"x"), lambda: store.get("k"),
                    lambda: list(store.list("")), lambda: lakestream.open(_uri(),
                                                                          storage_options=wrong)):
        with pytest.raises(PermissionDeniedError) as caught:
            attempt()
        said = str(caught.value)
        assert "did not accept the credentials" in said and code in said and fix in said, said
        assert "may not do this" not in said and "<?xml" not in said, said
        assert SECRET not in said and s3_options["AWS_SECRET_ACCESS_KEY"] not in said


def test_a_lack_of_permission_keeps_its_code_and_points_at_the_policies(
        s3_server: SeaweedS3) -> None:
    store = open_store(f"s3://{BUCKET}/{ROLES_PREFIX}", s3_server.options(READER))
    with pytest.raises(PermissionDeniedError) as caught:
        store.put("data/x", b"x")
    said = str(caught.value)
    assert "may not do this" in said and "S3 AccessDenied" in said, said
    assert "Least privilege" in said and "<?xml" not in said


def test_a_missing_bucket_is_named(s3_options: dict[str, str]) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFoundError) as caught:
        lakestream.open(f"s3://{bucket}/stream", storage_options=s3_options)
    said = str(caught.value)
    assert f"the bucket {bucket!r} does not exist (S3 NoSuchBucket)" in said, said
    assert "create it, or correct the bucket in the URI" in said
    with pytest.raises(NotFoundError, match=f"the bucket {bucket!r} does not exist"):
        open_store(f"s3://{bucket}/stream", s3_options).get("_delta_log/0.json")


def test_plain_http_needs_allow_http_named_before_any_request(
        s3_options: dict[str, str], clean_env) -> None:
    without = {k: v for k, v in s3_options.items() if k != "AWS_ALLOW_HTTP"}
    with pytest.raises(ValueError, match="storage option AWS_ENDPOINT_URL=http://.* is plain "
                       "HTTP.*set AWS_ALLOW_HTTP=true"):
        open_store(_uri(), without).put("k", b"x")
    # The endpoint and the permission from the environment, as the client reads them.
    endpoint = {k: v for k, v in without.items() if k != "AWS_ENDPOINT_URL"}
    clean_env.setenv("AWS_ENDPOINT_URL", s3_options["AWS_ENDPOINT_URL"])
    with pytest.raises(ValueError, match="environment variable AWS_ENDPOINT_URL=http"):
        open_store(_uri(), endpoint)
    clean_env.setenv("AWS_ALLOW_HTTP", "true")
    store = open_store(_uri(), endpoint)
    store.put("k", b"x")
    assert store.get("k") == b"x"


@pytest.mark.parametrize("url", ["not a url", "http://[::1", "127.0.0.1:9000", "ftp://host/",
                                 "http://127.0.0.1:99999", ""])
def test_an_invalid_endpoint_is_a_value_error_naming_it(s3_options: dict[str, str],
                                                        url: str) -> None:
    # Each of these was a Rust panic at the first request, which no `except` caught.
    with pytest.raises(ValueError, match="storage option AWS_ENDPOINT_URL=.* is not an "
                       "endpoint URL: use http://host:port"):
        open_store(_uri(), {**s3_options, "AWS_ENDPOINT_URL": url}).put("k", b"x")


@pytest.mark.parametrize("key", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                 "AWS_SESSION_TOKEN", "AWS_REGION"])
def test_a_newline_in_a_key_is_named_without_its_value(s3_options: dict[str, str],
                                                        key: str) -> None:
    with pytest.raises(ValueError, match=f"storage option {key}.* holds a character HTTP "
                       "cannot carry") as caught:
        open_store(_uri(), {**s3_options, key: f"{SECRET}\n"}).put("k", b"x")
    if key != "AWS_ACCESS_KEY_ID" and key != "AWS_REGION":
        assert SECRET not in str(caught.value)


def test_no_credentials_at_all_says_where_they_are_looked_for(
        s3_options: dict[str, str], clean_env) -> None:
    keyless = {k: v for k, v in s3_options.items() if "KEY" not in k}
    # The metadata service (the credentials of an instance role) at a closed port, so that
    # the test does not depend on the machine it runs on.
    keyless["AWS_METADATA_ENDPOINT"] = "http://127.0.0.1:9"
    with pytest.raises(PermissionDeniedError) as caught:
        open_store(_uri(), keyless).put("k", b"x")
    said = str(caught.value)
    assert "no S3 credentials were found" in said and "AWS_PROFILE" in said, said
    assert "may not do this" not in said


def test_the_default_profile_of_a_credentials_file_is_used(
        s3_options: dict[str, str], clean_env, tmp_path) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[default]\naws_access_key_id = {s3_options['AWS_ACCESS_KEY_ID']}\n"
                           f"aws_secret_access_key = {s3_options['AWS_SECRET_ACCESS_KEY']}\n")
    clean_env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    keyless = {k: v for k, v in s3_options.items() if "KEY" not in k}
    keyless["AWS_METADATA_ENDPOINT"] = "http://127.0.0.1:9"
    store = open_store(_uri(), keyless)
    store.put("k", b"from the file")
    assert store.get("k") == b"from the file"


def test_secrets_stay_out_of_reprs(s3_options: dict[str, str]) -> None:
    given = {**s3_options, "AWS_SESSION_TOKEN": "token-" + SECRET}
    options = S3Options.from_options(given)
    store = open_store(_uri(), s3_options)
    for shown in (repr(options), repr(vars(store)), repr(store)):
        assert s3_options["AWS_SECRET_ACCESS_KEY"] not in shown, shown
        assert SECRET not in shown, shown
    assert "'AWS_SECRET_ACCESS_KEY', '***'" in repr(options)
    assert s3_options["AWS_ENDPOINT_URL"] in repr(options)  # what is not secret still shows
    assert dict(options.config)["AWS_SESSION_TOKEN"] == "token-" + SECRET  # and still works


def test_a_scheme_in_capitals_opens_the_bucket(s3_options: dict[str, str]) -> None:
    store = open_store(_uri().replace("s3://", "S3://"), s3_options)
    assert store.uri.startswith(f"s3://{BUCKET}/")
    store.put("k", b"x")


def test_each_spelling_of_the_endpoint_reaches_the_server(s3_options, clean_env) -> None:
    """``AWS_ENDPOINT`` (object_store's alias) and ``endpoint`` work as ``AWS_ENDPOINT_URL``
    does, in the options or the environment (once reported as ``Duplicate key
    aws_endpoint``); two spellings at once are one setting, the option's winning."""
    url = s3_options["AWS_ENDPOINT_URL"]
    plain = {k: v for k, v in s3_options.items() if k != "AWS_ENDPOINT_URL"}
    for spelling in ("AWS_ENDPOINT", "endpoint", "aws_endpoint_url"):
        store = open_store(_uri(), {**plain, spelling: url})
        store.put("k", b"x")
        assert store.get("k") == b"x"
    clean_env.setenv("AWS_ENDPOINT", url)
    store = open_store(_uri(), {**plain, "AWS_ENDPOINT_URL": url})
    store.put("k", b"y")
    assert store.get("k") == b"y"
