"""Credentials the scrubber used to miss (issue 32, items 10 and 20): curl's ``-u`` / ``--user``, wget's
``--password=`` / ``--http-password=``, ``?code=`` and ``?jwt=`` query values, Azure ``AccountKey=``
connection strings, ``X-JFrog-Art-Api``-style headers; and ``repr(Source(...))``. The end-to-end tests use
real ``pipe:`` shards whose commands carry a password, through the places that leaked: the missing-sidecar
error and the command it suggests, ``ShardError`` and the ``on_error="skip"`` warning."""

from __future__ import annotations

import logging
import os
import traceback

import pytest

from streambatch.core.redact import scrub, scrub_url
from streambatch.streaming import ShardError, Source, StreamingBatches
from tests.support.corpus import index_corpus
from tests.support.shards import write_corpus

PASSWORD = "pa55W0rdValue77"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlVmFsdWU"
ACCOUNT_KEY = "Zm9vYmFyYmF6cXV4+/AccountKeyValue=="


def assert_clean(text: str) -> None:
    for secret in (PASSWORD, JWT, ACCOUNT_KEY):
        assert secret not in text, f"secret {secret!r} in: {text[:2000]}"


def full_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("text", [
    f"pipe:curl -s -u alice:{PASSWORD} https://host/a.tar",
    f"pipe:curl -s -ualice:{PASSWORD} https://host/a.tar",
    f"pipe:curl -s --user alice:{PASSWORD} https://host/a.tar",
    f"pipe:curl -s --user=alice:{PASSWORD} https://host/a.tar",
    f"pipe:curl -s --user 'alice:{PASSWORD}' https://host/a.tar",
    f"pipe:curl -s --proxy-user bob:{PASSWORD} -x http://proxy:3128 https://host/a.tar",
    f"pipe:curl -s --oauth2-bearer {PASSWORD} https://host/a.tar",
    f"pipe:wget -qO- --user=alice --password={PASSWORD} https://host/a.tar",
    f"pipe:wget -qO- --http-user=alice --http-password={PASSWORD} https://host/a.tar",
    f"pipe:wget -qO- --password {PASSWORD} https://host/a.tar",
    f"pipe:wget -qO- --ftp-password='{PASSWORD}' ftp://host/a.tar",
    f"pipe:wget -qO- --http-passwd={PASSWORD} https://host/a.tar",
    f"pipe:hfdl --token {PASSWORD} --repo o/n a.tar",
    f"pipe:fetch --api-key={PASSWORD} a.tar",
    f"pipe:AWS_SECRET_ACCESS_KEY={PASSWORD} aws s3 cp s3://b/a.tar -",
    f"pipe:HF_TOKEN='{PASSWORD}' python -m fetch a.tar",
    f"storage_options={{'key': 'AKID', 'secret': '{PASSWORD}', \"token\": \"{JWT}\"}}",
    f"https://host/a.tar?code={PASSWORD}",
    f"https://host/a.tar?part=1&code={PASSWORD}",
    f"https://host/a.tar?jwt={JWT}",
    f"https://host/a.tar?access_jwt={JWT}&x=1",
    f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net",
    f"AccountKey={ACCOUNT_KEY};AccountName=acct;DefaultEndpointsProtocol=https",
    f"connection_string='AccountName=acct;AccountKey={ACCOUNT_KEY}'",
    f"BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig={PASSWORD}",
    f"pipe:curl -s -H 'X-JFrog-Art-Api: {PASSWORD}' https://artifactory/a.tar",
    f"pipe:curl -s -H 'Private-Token: {PASSWORD}' https://gitlab/a.tar",
    f"pipe:curl -s --header \"X-Goog-Api-Key: {PASSWORD}\" https://host/a.tar",
    f"pipe:curl -s -H 'Proxy-Authorization: Basic {PASSWORD}' https://host/a.tar",
])
def test_scrub_masks_the_forms_it_missed(text):
    out = scrub(text)
    assert "***" in out
    assert_clean(out)
    if text.startswith("https://"):
        assert_clean(scrub_url(text))


def test_scrub_keeps_what_is_not_a_secret():
    for text in (
        "curl -s --user-agent streambatch https://host/a.tar",  # --user-agent is not --user
        "max_batch_tokens: saved 4000, now 3000",  # a state mismatch names settings, not headers
        "server answered Content-Range: bytes 0-9/100 and Content-Type: application/x-tar",
        "https://host/a.tar?part=1&shard=2",
        "sample key: 'u00001' at byte 10240",
        "pipe:curl -s -u alice https://host/a.tar",  # a user name alone: curl asks for the password
        "streambatch index SHARDS --max-batch-tokens 16000 --world-size 8",
        "{'max_batch_tokens': 4000, 'planner': 'greedy', 'key_field': 3}",
        "PYTHONPATH=/src python -m x --token-count 3",
    ):
        assert scrub(text) == text, scrub(text)


def test_curl_user_keeps_the_user_name():
    assert scrub(f"curl -u alice:{PASSWORD} https://h/a") == "curl -u alice:*** https://h/a"
    assert scrub(f"wget --password={PASSWORD} https://h/a") == "wget --password=*** https://h/a"


def test_source_repr_is_scrubbed():
    src = Source([f"https://alice:{PASSWORD}@host/a.tar?code={PASSWORD}",
                  f"pipe:curl -s -u alice:{PASSWORD} https://host/b.tar"], weight=0.5, name="speech")
    text = repr(src) + str(src) + repr([src])
    assert "Source(" in text and "speech" in text and "weight=0.5" in text
    assert_clean(text)


# ---------------------------------------------------------------- the places that leaked (real pipe: shards)


@pytest.fixture(scope="module")
def password_pipes(tmp_path_factory):
    """pipe: shards read with curl, the password on its command line, indexed into index_dir."""
    d = tmp_path_factory.mktemp("pw")
    _, paths, _ = write_corpus(d / "shards", [10, 9], seed=3)
    pipes = [f"pipe:curl -s -u alice:{PASSWORD} file://{os.path.abspath(p)}" for p in paths]
    pipes[1] = f"pipe:true --password={PASSWORD} --http-password={PASSWORD}; cat {paths[1]}"  # wget-style flags
    idx = str(d / "idx")
    index_corpus(pipes, index_dir=idx, catalog=False)
    return pipes, idx


def test_missing_sidecar_error_and_its_command_name_no_password(password_pipes, tmp_path):
    pipes, _ = password_pipes
    with pytest.raises(FileNotFoundError, match="no usable sidecar") as info:
        StreamingBatches(pipes, 400, 8, index_dir=str(tmp_path / "elsewhere"), verify=False)
    text = full_text(info.value)
    assert "streambatch index" in text and "-u alice:***" in text
    assert_clean(text)


class Broken:
    def __call__(self, sample):
        raise RuntimeError(f"cannot decode {sample['__url__']}")


def test_shard_error_names_no_password(password_pipes, tmp_path):
    pipes, idx = password_pipes
    ds = StreamingBatches(pipes, 400, 8, index_dir=idx, decode=Broken(), cache_dir=str(tmp_path))
    with pytest.raises(ShardError, match="decoding sample") as info:
        next(iter(ds))
    assert "***" in str(info.value)
    assert_clean(full_text(info.value))


def test_skip_warning_names_no_password(password_pipes, tmp_path, caplog):
    pipes, idx = password_pipes
    ds = StreamingBatches(pipes, 400, 8, index_dir=idx, decode=Broken(), on_error="skip", cache_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="streambatch"):
        assert sum(len(b) for b in ds) == 0
    assert ds.num_skipped == 19 and "skipping a sample" in caplog.text
    assert_clean(caplog.text)
