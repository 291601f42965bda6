"""Asking for a Ray cluster that is not there fails at once, in one line naming the address
(Ray on its own retries an unreachable address for minutes). No Ray instance is running here."""

from __future__ import annotations

import pytest

from etstore.app.fanout import fanout
from etstore.errors import OptionError

pytest.importorskip("ray")


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1:1", "Connection refused at 127.0.0.1:1"),
        ("ray://127.0.0.1:1", "Connection refused at 127.0.0.1:1"),
        ("auto", "Could not find any running Ray instance"),
    ],
)
def test_an_unreachable_cluster_is_a_one_line_option_error(address: str, why: str) -> None:
    with pytest.raises(OptionError) as err, fanout(address):
        pass
    text = str(err.value)
    assert text.startswith(f"--ray {address}: cannot reach a Ray cluster") and why in text
    assert "\n" not in text


def test_ray_address_in_the_environment_is_probed_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(OptionError, match=r"^--ray 127\.0\.0\.1:1: cannot reach"), fanout("local"):
        pass
