"""The workers' test-only failpoint: off unless set, and a misspelt one is an error, not ignored."""

from __future__ import annotations

import pytest

from astraflow.errors import ConfigError
from astraflow.failpoints import episode_delay_s


def test_episode_delay_is_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASTRAFLOW_WORKER_FAILPOINT", raising=False)
    assert episode_delay_s() == 0.0
    monkeypatch.setenv("ASTRAFLOW_WORKER_FAILPOINT", "episode_delay_ms:250")
    assert episode_delay_s() == 0.25


@pytest.mark.parametrize(
    "spec", ["episode_delay_ms:", "episode_delay_ms:1.5", "episode_delay:250", "after_publish:3"]
)
def test_a_misspelt_failpoint_is_an_error(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv("ASTRAFLOW_WORKER_FAILPOINT", spec)
    with pytest.raises(ConfigError, match="episode_delay_ms"):
        episode_delay_s()
