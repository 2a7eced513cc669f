"""jobpool/gcpause.py: the collector held off for a block, and left as it was found."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from jobpool import gcpause


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    gc.enable()
    yield
    gc.enable()


def test_off_within_the_block_and_on_after_it_even_when_it_raises() -> None:
    with gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gcpause.paused():
        raise RuntimeError("a sweep that fails")
    assert gc.isenabled()


def test_a_block_entered_with_the_collector_off_leaves_it_off() -> None:
    gc.disable()
    with gcpause.paused(), gcpause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
