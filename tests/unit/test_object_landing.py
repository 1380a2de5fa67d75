"""ObjectLanding without a server: which keys may be opened, identities of objects, and the
one line of each store error (tests/integration/test_s3_landing.py runs them on moto)."""

from __future__ import annotations

import pytest

from enumerator_service._file_identity import FileIdentity
from enumerator_service._object_landing import ObjectLanding, OutsidePrefixError, storage_error
from enumerator_service._storage import StorageOptions

OPTIONS = StorageOptions("http://127.0.0.1:9", "us-east-1")


def test_only_plain_keys_inside_the_prefix_are_opened() -> None:
    landing = ObjectLanding.of("s3://bkt/land", OPTIONS)
    assert landing.path_of("s3://bkt/land/dt=2026-01-01/a b é.jsonl") == (
        "bkt/land/dt=2026-01-01/a b é.jsonl"
    )
    for uri in (
        "s3://bkt/landing/x.jsonl",  # a sibling prefix sharing the name's start
        "s3://bkt/other/x.jsonl",
        "s3://bkt/land/../x.jsonl",
        "s3://bkt/land/dt=2026-01-01//x.jsonl",
        "s3://bkt/land/./x.jsonl",
        "s3://other/land/x.jsonl",
    ):
        with pytest.raises(OutsidePrefixError):
            landing.path_of(uri)


def test_an_object_identity_has_no_inode_and_whole_seconds() -> None:
    listed = FileIdentity.of_object(10, 1_700_000_000_123_000_000)  # a listing's milliseconds
    headed = FileIdentity.of_object(10, 1_700_000_000_000_000_000)  # a HEAD's seconds
    assert listed.same_as(headed) and listed.inode is None
    assert listed.changed_at == 1_700_000_000.0
    assert not FileIdentity.of_object(11, 1_700_000_000_000_000_000).same_as(headed)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            "When listing objects under key 'p/' in bucket 'b': AWS Error NETWORK_CONNECTION "
            "during ListObjectsV2 operation: curlCode: 7, Could not connect to server",
            "the storage endpoint http://127.0.0.1:9 is unreachable (setting "
            "SLUICE_S3_ENDPOINT_URL)",
        ),
        (
            "AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 operation: The AWS Access Key"
            " Id you provided does not exist in our records.",
            "access denied: check the credentials of the standard chain",
        ),
        (
            "AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: The specified bucket does"
            " not exist",
            "the bucket does not exist (check the landing URI)",
        ),
        ("something else\non two lines", "something else on two lines"),
    ],
)
def test_store_errors_are_one_line_naming_the_setting(error: str, expected: str) -> None:
    text = str(storage_error("events: landing s3://b/p", OSError(error), OPTIONS))
    assert text.startswith("events: landing s3://b/p: ") and expected in text
    assert "\n" not in text
