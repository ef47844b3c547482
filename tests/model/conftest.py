"""Fixtures shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Hundreds of tiny ops: intra-op threads only spin against other processes here.
    A module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
