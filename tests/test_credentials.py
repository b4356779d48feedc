"""Endpoint credentials reach the server and nothing else: not stdout, stderr, written files or MLflow.

The CLI runs as a real process against a closed port and against a loopback server that demands the
credentials (tests/fake_endpoint.py); the profile stage runs in process with the real MLflow store.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmcap import exit_codes
from llmcap.credentials import (
    api_key_from_env,
    redact_headers,
    redact_text,
    redact_url,
    split_userinfo,
)
from llmcap.errors import LlmcapError
from stages import profile as stage
from tests.conftest import ROOT
from tests.fake_endpoint import MODEL, fake_endpoint

PASSWORD = "s3cretpw"
API_KEY = "sk-test-k3yvalue"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmcap", "profile", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


# ------------------------------------------------------------------------------------------ redaction


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:s3cretpw@host:8000", "http://user:***@host:8000"),
        ("https://user:s3cretpw@host/v1?api_key=k1&x=1", "https://user:***@host/v1?api_key=***&x=1"),
        ("http://host:8000/?token=abc&TOKEN=def", "http://host:8000/?token=***&TOKEN=***"),
        ("https://ghp_tokenonly@host", "https://***@host"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://u:p@ss@host:1/v1", "http://u:***@host:1/v1"),
    ],
)
def test_redact_url_masks_passwords_and_token_queries(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_masks_urls_inside_messages() -> None:
    text = "ConnectError: http://user:s3cretpw@h:1/v1/completions?key=abc&n=2 failed; retry https://tok@h2/x"
    assert (
        redact_text(text)
        == "ConnectError: http://user:***@h:1/v1/completions?key=***&n=2 failed; retry https://***@h2/x"
    )
    assert redact_text("no url here: user@example.com") == "no url here: user@example.com"


def test_split_userinfo_gives_the_url_to_request_and_the_pair_to_send() -> None:
    assert split_userinfo("http://us%40er:p%40ss@h:8000/v1") == ("http://h:8000/v1", ("us@er", "p@ss"))
    assert split_userinfo("http://h:8000") == ("http://h:8000", None)


def test_redact_headers() -> None:
    shown = redact_headers({"Authorization": "Bearer sk-1", "X-Api-Key": "k", "Accept": "text/event-stream"})
    assert shown == {"Authorization": "***", "X-Api-Key": "***", "Accept": "text/event-stream"}


def test_api_key_comes_from_the_named_variable_or_the_default_one() -> None:
    assert api_key_from_env(None, {}) is None
    assert api_key_from_env(None, {"LLMCAP_API_KEY": "k0"}) == "k0"
    assert api_key_from_env("OPENAI_API_KEY", {"OPENAI_API_KEY": "k1", "LLMCAP_API_KEY": "k0"}) == "k1"
    with pytest.raises(LlmcapError, match="OPENAI_API_KEY .* not set"):
        api_key_from_env("OPENAI_API_KEY", {})
    with pytest.raises(LlmcapError, match="not an environment variable name") as err:
        api_key_from_env("sk-live-abc")  # someone pasted the key itself
    assert "sk-live-abc" in str(err.value)  # it is the name the user gave; the message says to name a variable


# ------------------------------------------------------------------------------------------ the CLI


def test_cli_never_prints_the_password_of_an_unreachable_endpoint() -> None:
    endpoint = f"http://user:{PASSWORD}@127.0.0.1:{_closed_port()}"
    asks_models = _cli("--endpoint", endpoint)
    measures = _cli(
        "--endpoint", endpoint, "--model", "m", "--isl", "16", "--concurrency", "1", "--osl", "4", "--repeats", "1"
    )
    for result in (asks_models, measures):
        assert result.returncode == exit_codes.UNREACHABLE, result.stderr  # nothing listens there
        assert PASSWORD not in result.stdout + result.stderr
        assert "Traceback" not in result.stderr
    # the endpoint is still named, with its password masked
    assert "error: http://user:***@127.0.0.1:" in asks_models.stderr and "no answer (ConnectError" in asks_models.stderr
    assert "every request to http://user:***@127.0.0.1:" in measures.stderr


def test_cli_sends_url_credentials_as_basic_auth_and_prints_none_of_them(tmp_path: Path) -> None:
    token = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    with fake_endpoint(f"Basic {token}") as server:
        endpoint = server.url.replace("http://", f"http://user:{PASSWORD}@")
        result = _cli(
            "--endpoint",
            endpoint,
            "--isl",
            "16,64",
            "--concurrency",
            "1,2",
            "--osl",
            "16",
            "--repeats",
            "1",
            "--vocab-size",
            "100",
            "--out",
            str(tmp_path / "prof"),
            "--json",
        )
    assert result.returncode == 0, result.stderr
    assert set(server.authorizations) == {f"Basic {token}"}  # every request authenticated, none without
    assert "/v1/completions" in server.paths
    summary = json.loads(result.stdout)
    assert summary["endpoint"] == endpoint.replace(PASSWORD, "***") and summary["model"] == MODEL
    written = _files_text(tmp_path / "prof")
    assert json.loads((tmp_path / "prof" / "manifest.json").read_text())["base_url"] == summary["endpoint"]
    for text in (result.stdout, result.stderr, written):
        assert PASSWORD not in text and token not in text


def test_cli_sends_the_api_key_from_the_named_variable_as_a_bearer_token(tmp_path: Path) -> None:
    with fake_endpoint(f"Bearer {API_KEY}") as server:
        ok = _cli(
            "--endpoint",
            server.url,
            "--isl",
            "16",
            "--concurrency",
            "1,2",
            "--osl",
            "16",
            "--repeats",
            "1",
            "--vocab-size",
            "100",
            "--out",
            str(tmp_path / "prof"),
            "--api-key-env",
            "MY_ENGINE_KEY",
            env={"MY_ENGINE_KEY": API_KEY},
        )
        without = _cli(
            "--endpoint",
            server.url,
            "--isl",
            "16",
            "--concurrency",
            "1",
            "--osl",
            "4",
            "--repeats",
            "1",
            env={"LLMCAP_API_KEY": ""},
        )
    assert ok.returncode == 0, ok.stderr
    assert f"Bearer {API_KEY}" in server.authorizations
    assert API_KEY not in ok.stdout + ok.stderr + _files_text(tmp_path / "prof")
    # no key: the server refuses (401), and the CLI says so in one line
    assert without.returncode == 2 and "answered HTTP 401: the endpoint wants credentials" in without.stderr
    assert len(without.stderr.strip().splitlines()) == 1 and "Traceback" not in without.stderr


def test_cli_refuses_a_named_variable_that_is_unset() -> None:
    result = _cli("--endpoint", "http://127.0.0.1:9", "--api-key-env", "LLMCAP_TEST_UNSET_VAR")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: environment variable LLMCAP_TEST_UNSET_VAR (named to hold the endpoint's API key) is not set or empty"
    )


# ------------------------------------------------------------------------------------------ the stage


def _stage_args(tmp_path: Path, profile_params: dict) -> list[str]:
    params = {"trace": {"file": "unused.jsonl"}, "enumerate": {"model": "Llama-3.1-8B"}, "profile": profile_params}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return [
        "--params",
        str(tmp_path / "params.yaml"),
        "--catalog-dir",
        str(ROOT / "llmcap" / "catalog" / "data"),
        "--profile",
        str(tmp_path / "stored"),
        "--step-model",
        str(tmp_path / "out" / "step_model.json"),
        "--report-dir",
        str(tmp_path / "reports"),
    ]


def _mlflow_text() -> str:
    """Every param and tag of every run in the test store, as one text."""
    import mlflow

    client = mlflow.MlflowClient()
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=10_000)]
    assert runs  # the store is the one the stages write to
    return "\n".join(f"{k}={v}" for r in runs for d in (r.data.params, r.data.tags) for k, v in d.items())


def test_stage_refuses_a_password_in_params_yaml_without_echoing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # params.yaml is committed and DVC copies param values into dvc.lock: a password there is already leaked
    args = _stage_args(tmp_path, {"endpoint": f"http://user:{PASSWORD}@127.0.0.1:{_closed_port()}", "tp": 2})
    assert stage.main(args) == 2
    out, err = capsys.readouterr()
    assert "field 'profile.endpoint': carries a credential" in err and "profile.api_key_env" in err
    assert PASSWORD not in out + err
    assert not (tmp_path / "out").exists()


def test_stage_profiles_with_the_api_key_and_logs_only_the_variable_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    monkeypatch.setenv("LLMCAP_TEST_ENGINE_KEY", API_KEY)
    with fake_endpoint(f"Bearer {API_KEY}") as server:
        args = _stage_args(
            tmp_path,
            {
                "endpoint": server.url,
                "api_key_env": "LLMCAP_TEST_ENGINE_KEY",
                "served_model": MODEL,
                "gpu": "h100",
                "tp": 2,
                "isl": [16, 64],
                "concurrency": [1, 2],
                "osl": 16,
                "repeats": 1,
            },
        )
        assert stage.main(args) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert set(server.authorizations) == {f"Bearer {API_KEY}"}
    assert json.loads((tmp_path / "out" / "step_model.json").read_text())["source"] == "profile-measured"

    run = mlflow.search_runs(
        experiment_names=["llmcap"],
        filter_string="tags.`dvc.stage` = 'profile'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    ).iloc[0]
    assert run["params.profile.endpoint"] == server.url
    assert run["params.profile.api_key_env"] == "LLMCAP_TEST_ENGINE_KEY"
    artifacts = mlflow.artifacts.download_artifacts(run_id=run["run_id"], dst_path=str(tmp_path / "artifacts"))
    assert (Path(artifacts) / "profile" / "table" / "manifest.json").exists()
    for text in (
        out,
        err,
        _mlflow_text(),
        _files_text(Path(artifacts)),
        _files_text(tmp_path / "reports"),
        _files_text(tmp_path / "out"),
    ):
        assert API_KEY not in text


def test_stage_reports_an_unreachable_endpoint_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _stage_args(
        tmp_path,
        {
            "endpoint": f"http://127.0.0.1:{_closed_port()}",
            "tp": 2,
            "isl": [16],
            "concurrency": [1],
            "osl": 4,
            "repeats": 1,
        },
    )
    assert stage.main(args) == 2
    err = capsys.readouterr().err
    assert "error: profile.endpoint: every request to http://127.0.0.1:" in err and "Traceback" not in err
