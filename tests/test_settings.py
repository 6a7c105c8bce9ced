"""Settings: the TOML file of SPEC §15 and the RESUMEQ_* variables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from resumeq.core.defaults import DEFAULT_REDIS_URL, LIMIT_DEFAULTS, STORE_DEFAULTS
from resumeq.core.errors import ConfigError
from resumeq.core.settings import Settings, StoreSettings, load_settings
from resumeq.core.spec import Limits

EXAMPLE = """
[providers.local]
kind = "openai"
base_url = "http://127.0.0.1:8000/v1"
api_key_env = "LOCAL_API_KEY"
continue_mode = "instruction"
counting = "chunks"
resume_context = "full"
stall_timeout_s = 30
prices = { input = 3.0, cached_input = 0.3, output = 15.0 }

[providers.claude]
kind = "anthropic"
base_url = "https://api.anthropic.com"
continue_mode = "prefill"
resume_context = "tail:256"

[worker]
flush_tokens = 32
flush_ms = 250
lease_ttl_ms = 15000

[janitor]
interval_s = 2.0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "resumeq.toml"
    path.write_text(text)
    return path


def test_the_spec_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESUMEQ_CONFIG", str(write(tmp_path, EXAMPLE)))
    monkeypatch.setenv("RESUMEQ_REDIS_URL", "redis://example:6380/2")
    s = load_settings()
    assert s.redis_url == "redis://example:6380/2"
    local = s.profile("local")
    assert local.kind == "openai" and local.prices is not None and local.prices.output == 15.0
    assert local.tail_tokens is None and s.profile("claude").tail_tokens == 256
    assert s.file.worker.flush_tokens == 32 and s.file.janitor.interval_s == 2.0


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESUMEQ_CONFIG", raising=False)
    monkeypatch.delenv("RESUMEQ_REDIS_URL", raising=False)
    s = load_settings()
    assert s.redis_url == "redis://localhost:6379/0"
    assert s.file.worker.lease_ttl_ms == 15000 and s.file.providers == {}


def test_explicit_arguments_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESUMEQ_REDIS_URL", "redis://env:1/0")
    assert load_settings(redis_url="redis://arg:2/0").redis_url == "redis://arg:2/0"


def test_unknown_profile_names_the_known_ones(tmp_path: Path) -> None:
    s = load_settings(config_path=write(tmp_path, EXAMPLE))
    with pytest.raises(
        ConfigError, match=r"unknown provider profile 'nope' \(known: claude, local\)"
    ):
        s.profile("nope")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('[providers.x]\nkind = "grpc"\nbase_url = "http://h"\n', "providers.x.kind"),
        ('[providers.x]\nkind = "openai"\nbase_url = "ftp://h"\n', "providers.x.base_url"),
        (
            '[providers.x]\nkind = "openai"\nbase_url = "http://h"\napi_key_env = "sk-live-123"\n',
            "providers.x.api_key_env",
        ),
        (
            '[providers.x]\nkind = "openai"\nbase_url = "http://h"\nresume_context = "tail:0"\n',
            "providers.x.resume_context",
        ),
        ("[worker]\nflush_tokens = 0\n", "worker.flush_tokens"),
        ("[worker]\nflush_every = 3\n", "worker.flush_every"),
        ("[janitor]\ninterval_s = -1\n", "janitor.interval_s"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(ConfigError, match=rf"resumeq.toml: {where}:"):
        load_settings(config_path=write(tmp_path, text))


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(config_path=tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(config_path=write(tmp_path, "[worker\n"))


def test_every_problem_in_a_config_file_is_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[providers.x]\nkind = "grpc"\nbase_url = "ftp://h"\n'
        "[worker]\nflush_tokens = 0\n[janitor]\ninterval_s = -1\n",
    )
    with pytest.raises(ConfigError) as info:
        load_settings(config_path=path)
    lines = str(info.value).splitlines()
    wheres = [
        "providers.x.kind",
        "providers.x.base_url",
        "worker.flush_tokens",
        "janitor.interval_s",
    ]
    assert len(lines) == len(wheres), lines
    for line, where in zip(lines, wheres, strict=True):
        assert line.startswith(f"config file {path}: {where}: "), line
    assert "more" not in str(info.value)


def test_empty_variables_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESUMEQ_CONFIG", "")
    monkeypatch.setenv("RESUMEQ_REDIS_URL", "")
    s = load_settings()
    assert s.config_path is None and s.redis_url == "redis://localhost:6379/0"


def test_a_config_variable_naming_no_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESUMEQ_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.toml"):
        load_settings()


def test_the_defaults_without_a_model_are_the_models_defaults() -> None:
    """What a command without a config file hands the store (resumeq.core.defaults) is what
    the settings models default to."""
    assert StoreSettings().model_dump() == dataclasses.asdict(STORE_DEFAULTS)
    assert Limits().model_dump() == dataclasses.asdict(LIMIT_DEFAULTS)
    assert Settings().redis_url == DEFAULT_REDIS_URL
