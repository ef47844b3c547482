"""Bounded waits for the other ranks (docs/design.md, "No silent hangs").

A rank waits for the others in collectives and barriers, and inside an engine's forward,
backward and step (DDP and Horovod all-reduce there, FSDP gathers, DeepSpeed does all of
it). Each such place runs inside `watch.waiting(name)`; nested names say where ("the
loss all-reduce (step 12)"). Two things bound the wait:

- a watchdog thread: when a rank has been inside a waiting block for --collective_timeout
  seconds without any block starting or ending, it reports one `error:` line naming the
  wait and ends the process. The thread is what makes the bound hold on CUDA, where an
  NCCL collective returns at once, the host blocks later in a synchronisation, and NCCL's
  own watchdog aborts the process without a word of ours;
- the engines' own timeouts (the process group, DeepSpeed's, Horovod's gloo timeout and
  stall shutdown), set ENGINE_GRACE_S later as a backstop: they end the wait even if the
  thread never gets to run.

A failure the engine reports sooner (a dead peer's closed connection) leaves the block as
PeerLost, with the same message.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from types import TracebackType

from dalle_dist.errors import PeerLost

#: Seconds the engines' own timeouts add to --collective_timeout, so that the watchdog,
#: which names the wait, fires first.
ENGINE_GRACE_S = 30.0
#: The documented default of --collective_timeout: NCCL's usual 30 minutes, long enough
#: for rank 0 to write a large checkpoint while the others wait at the barrier after it.
DEFAULT_TIMEOUT_S = 1800.0

# What gloo, NCCL, the c10d store and Horovod say when a peer is gone or too slow. Only
# exceptions raised inside a waiting block are tested, so a model bug keeps its traceback;
# NCCL's own configuration errors (invalid usage, system errors) are not peer failures.
_PEER_FAILURE = re.compile(
    r"Connection (?:reset|closed|refused)|by peer|Broken pipe|[Tt]imed out|timeout"
    r"|gloo/transport|ncclRemoteError|communicator was aborted|remote process"
    r"|Horovod has been shut down")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether `exc` says that another rank died, hung or left (not a bug in this rank)."""
    import torch.distributed as dist

    if isinstance(exc, PeerLost):
        return False  # already reported by an inner block
    if isinstance(exc, (dist.DistNetworkError, dist.DistStoreError)):
        return True
    if type(exc).__name__ == "HorovodInternalError":
        return True
    return isinstance(exc, RuntimeError) and bool(_PEER_FAILURE.search(str(exc)))


def peer_lost(rank: int, waited: float, where: str) -> PeerLost:
    return PeerLost(f"rank {rank} waited {waited:.0f} s in {where} for the other ranks; a "
                    "rank died, hung or took another path",
                    "see its log; then dalle-dist doctor LOG")


class CollectiveWatch:
    """The waits of one rank, and the thread that ends the rank when one runs too long.

    Not thread-safe for several waiting threads: only the main thread opens blocks (the
    watchdog reads one tuple, which the interpreter replaces atomically).
    """

    def __init__(self, timeout_s: float, rank: int) -> None:
        self.timeout_s = timeout_s
        self.rank = rank
        # Innermost last; None: working alone (writing a file), not waiting for anyone.
        self._state: tuple[tuple[str | None, ...], float] = ((), time.monotonic())
        self._thread: threading.Thread | None = None
        self._on_expire: Callable[[PeerLost], object] | None = None

    # -- blocks ---------------------------------------------------------------------------

    def waiting(self, name: str) -> _Block:
        """A block in which this rank may wait for the others; `name` says for what."""
        return _Block(self, name)

    def working_alone(self) -> _Block:
        """A block in which this rank works on its own (the root writing a checkpoint while
        the others wait at the barrier after it): no deadline runs inside."""
        return _Block(self, None)

    def where(self, names: tuple[str | None, ...] | None = None) -> str:
        """`innermost (outer, outermost)`: what the rank is waiting in."""
        named = [n for n in (self._state[0] if names is None else names) if n]
        if not named:
            return "a collective"
        inner, outer = named[-1], named[-2::-1]
        return f"{inner} ({', '.join(outer)})" if outer else inner

    def _push(self, name: str | None) -> None:
        self._state = ((*self._state[0], name), time.monotonic())

    def _pop(self, exc: BaseException | None) -> None:
        names, since = self._state
        self._state = (names[:-1], time.monotonic())  # a finished wait is progress
        if exc is not None and names and names[-1] is not None and is_peer_failure(exc):
            raise peer_lost(self.rank, time.monotonic() - since, self.where(names)) from None

    # -- the watchdog ---------------------------------------------------------------------

    def start(self, on_expire: Callable[[PeerLost], object]) -> None:
        """Run the watchdog; `on_expire(error)` must end the process (the main thread is
        blocked in the engine and cannot be interrupted)."""
        self._on_expire = on_expire
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="dalle_dist-watch",
                                            daemon=True)
            self._thread.start()

    def expired(self) -> PeerLost | None:
        """The error to report when the current wait has run past the timeout."""
        names, since = self._state
        waited = time.monotonic() - since
        if not names or names[-1] is None or waited < self.timeout_s:
            return None
        return peer_lost(self.rank, waited, self.where(names))

    def _watch(self) -> None:
        poll = min(1.0, self.timeout_s / 10)
        while True:
            time.sleep(poll)
            error = self.expired()
            if error is not None and self._on_expire is not None:
                self._on_expire(error)
                return


class _Block:
    """The context manager of `waiting` and `working_alone` (a class: it runs every step)."""

    __slots__ = ("name", "watch")

    def __init__(self, watch: CollectiveWatch, name: str | None) -> None:
        self.watch, self.name = watch, name

    def __enter__(self) -> None:
        self.watch._push(self.name)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.watch._pop(exc)
