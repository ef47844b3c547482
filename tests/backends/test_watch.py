"""The wait bound itself (backends/watch.py), in one process: deadlines, names, and which
engine failures count as a lost peer.

The messages classified here are the ones the engines really raised on this machine when a
peer was stopped or killed (gloo 2-rank runs under torchrun and horovodrun, December 2026);
the multi-process behaviour is tested in test_peer_failures.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from dalle_dist.backends.watch import CollectiveWatch, is_peer_failure
from dalle_dist.errors import PeerLost

GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
                " Timed out waiting 5000ms for recv operation to complete")
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
              "error [127.0.0.1]:1967: Connection reset by peer. This is typically caused by a "
              "remote worker hanging or bugs in the application.")
HOROVOD_SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of "
                     "the ranks or an attempt to allreduce, allgather or broadcast a tensor "
                     "after one of the ranks finished execution.")


class HorovodInternalError(RuntimeError):
    """Horovod's class of that name (horovod.common.exceptions), without importing it."""


@pytest.mark.parametrize("exc", [
    RuntimeError(GLOO_TIMEOUT),
    RuntimeError(GLOO_RESET),
    HorovodInternalError(RuntimeError(HOROVOD_SHUT_DOWN)),
    RuntimeError("NCCL communicator was aborted on rank 1."),
], ids=["gloo-timeout", "gloo-reset", "horovod-shut-down", "nccl-aborted"])
def test_peer_failures_are_recognised(exc: BaseException) -> None:
    assert is_peer_failure(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x32 and 64x32)"),
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1269, invalid usage"),
    ValueError("Timed out waiting"),  # not an engine's exception type
    PeerLost("rank 0 waited 0 s in x for the other ranks"),  # already reported inside
], ids=["shape-bug", "cuda-oom", "nccl-invalid-usage", "not-runtime-error", "already-peer-lost"])
def test_own_failures_keep_their_traceback(exc: BaseException) -> None:
    assert not is_peer_failure(exc)


def test_a_wait_expires_after_the_timeout_naming_where() -> None:
    watch = CollectiveWatch(0.2, rank=1)
    with watch.waiting("step 3"), watch.waiting("the loss all-reduce"):
        assert watch.expired() is None
        time.sleep(0.25)
        error = watch.expired()
    assert error is not None and error.exit_status == 3
    assert str(error).startswith("rank 1 waited 0 s in the loss all-reduce (step 3) for the "
                                 "other ranks; a rank died, hung or took another path (see "
                                 "its log; then dalle-dist doctor LOG)")
    assert watch.expired() is None, "no block open: nothing to wait for"


def test_progress_restarts_the_clock() -> None:
    """Each finished collective is progress: a long step of many quick waits never expires."""
    watch = CollectiveWatch(0.2, rank=0)
    with watch.waiting("step 1"):
        for _ in range(4):
            time.sleep(0.08)
            with watch.waiting("a quick all-reduce"):
                pass
        assert watch.expired() is None


def test_working_alone_pauses_the_deadline() -> None:
    """The root writing a checkpoint for longer than the timeout is not a hang of its own."""
    watch = CollectiveWatch(0.1, rank=0)
    with watch.waiting("the checkpoint save at step 10"):
        with watch.working_alone():
            time.sleep(0.15)
            assert watch.expired() is None
        assert watch.expired() is None, "the write's end restarted the clock"
        time.sleep(0.15)
        assert "the checkpoint save at step 10" in str(watch.expired())


def test_a_peer_failure_leaves_the_block_as_peer_lost() -> None:
    watch = CollectiveWatch(60, rank=1)
    with pytest.raises(PeerLost, match=r"^rank 1 waited 0 s in the digest gather \(the "
                                       r"parameter comparison\) for the other ranks"):
        with watch.waiting("the parameter comparison"), watch.waiting("the digest gather"):
            raise RuntimeError(GLOO_RESET)
    with pytest.raises(ZeroDivisionError):  # a bug of this rank is not a lost peer
        with watch.waiting("step 1"):
            1 / 0  # noqa: B018


def test_the_watchdog_thread_reports_a_stuck_wait() -> None:
    """The thread, not the blocked main thread, must call on_expire once the bound passes."""
    reported: list[PeerLost] = []
    called = threading.Event()
    watch = CollectiveWatch(0.3, rank=1)

    def on_expire(error: PeerLost) -> None:
        reported.append(error)
        called.set()

    watch.start(on_expire)
    started = time.monotonic()
    with watch.waiting("the built-in VAE broadcast"):
        assert called.wait(5), "the watchdog never fired"
    assert 0.3 <= time.monotonic() - started < 2
    assert len(reported) == 1 and "in the built-in VAE broadcast for" in str(reported[0])


class LateResult:
    """An all-reduce's result as NCCL returns it: the call comes back at once and the wait
    happens when the host reads it (`.tolist()`); records where the rank was waiting then."""

    def __init__(self, values: list[float], watch: CollectiveWatch, seen: list[str]) -> None:
        self.values, self.watch, self.seen = values, watch, seen

    def tolist(self) -> list[float]:
        self.seen.append(self.watch.where())
        return self.values


def test_a_collectives_result_is_read_inside_its_named_wait() -> None:
    """Issue 24, item 5: `drain` read the metrics all-reduce's result after the waiting
    block had closed, so on NCCL a dead peer left the rank waiting unnamed (NCCL's own
    abort, not our line). The read must happen inside the block that names the wait."""
    import torch

    from dalle_dist.backends.single import SingleBackend
    from dalle_dist.train.loop import DeviceSums

    seen: list[str] = []

    class TwoRanks(SingleBackend):
        def _average(self, tensor: torch.Tensor, name: str) -> LateResult:  # type: ignore[override]
            assert self.watch is not None
            return LateResult(tensor.float().tolist(), self.watch, seen)

    backend = TwoRanks.on(torch.device("cpu"))
    backend.world_size = 2
    sums = DeviceSums()
    sums.add({"loss": torch.tensor(2.0)})
    values, stop = sums.drain(backend, True, torch.device("cpu"))
    assert values == {"loss": 2.0} and stop
    assert seen == ["the metrics and stop-flag all-reduce"]
    assert backend.average_to_host(torch.tensor([1.0, 3.0]), "the validation loss all-reduce") \
        == [1.0, 3.0]
    assert seen[-1] == "the validation loss all-reduce"
