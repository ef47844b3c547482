"""`train --compile`: torch.compile per transformer block, as torchtitan applies it.

Each block's training call is compiled on its own (model/transformer.py,
Block.compile_training) with fullgraph=True, so a graph break inside a block is an error,
never a silent split; blocks alike (same pattern, same options) share one graph. The
embeddings, the logits and the loss stay eager: they run once per step, and they hold what
would make a whole-model graph break or recompile (the sampling loop, caches).

Order: the blocks are compiled when the task builds the model, after activation
checkpointing is set (the checkpoint is traced inside the block's graph) and before any
backend wraps or shards it. torch.compile is lazy: the graphs are traced on the first
compiled call, on the device, after FSDP2's fully_shard, DDP, DeepSpeed or Horovod have
done their part, and their hooks stay on the block's own __call__, outside the graph.

In the training loop the first step of each process runs eager (CompiledBlocks.eager):
the loop watches that step (the matmul dtypes it logs) with hooks on every layer, and a
graph traced with a hook in it is guarded on the hook, so it would be traced again once
the hook is gone. The blocks compile in the second step.

The compile time is the compiling step's time less the next step's, both measured to the
end of the device's work: the figure a user weighs against the faster steps. A run that
ends with the compiling step logs that step's time, compile included (CompiledBlocks.
finish).
docs/design.md, "Compiled blocks", says when it pays off.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from dalle_dist.errors import ConfigError
from dalle_dist.model.config import COMPILE_BACKENDS
from dalle_dist.model.toolchain import require_toolchain

if TYPE_CHECKING:
    from dalle_dist.backends import DistributedBackend
    from dalle_dist.model.transformer import Transformer

#: --compile_backend's default (model/config.py's COMPILE_BACKENDS say what each does)
DEFAULT_BACKEND = COMPILE_BACKENDS[0]
#: Steps a run times while waiting for the compiling step and one that traced no graph
#: after it (the blocks compile in the first timed step, and the second traces nothing).
TIMED_STEPS = 3
#: Added to torch.compile's cache key tag while AOTAutograd's donated buffers are off
#: (no_donated_buffers): the caches do not key on that setting.
NO_DONATED_BUFFERS_TAG = "dalle_dist:no-donated-buffers"


def check_compile(compiler: str, backend: DistributedBackend) -> None:
    """What torch.compile with `compiler` needs on this rank's device (inductor's build
    tools: model/toolchain.py), and whether the distributed backend lets a block compile
    whole (DistributedBackend.prepare_compiled_blocks), checked before the model is built:
    a missing compiler, Python.h or a graph break would otherwise fail the first compiled
    step with a long traceback."""
    import torch._dynamo

    backend.prepare_compiled_blocks()
    device = backend.device
    if not torch._dynamo.is_dynamo_supported():
        raise ConfigError(f"--compile: torch.compile does not run on Python "
                          f"{sys.version_info.major}.{sys.version_info.minor} with torch "
                          f"{torch.__version__}", "drop --compile")
    if compiler == "inductor":
        require_toolchain(device.type, "--compile: inductor", "use --compile_backend aot_eager")


class CompiledBlocks:
    """The compiled blocks of one model: how many graphs the backend was asked for and
    what the compiling step cost.

    `graphs` counts the graphs dynamo handed to the backend (a recompile is one more);
    with fullgraph=True a block that breaks raises instead, so every graph is a whole
    block. Every graph is traced in one step (the first compiled one); a graph traced in
    a later step is a recompile, and the log says so."""

    def __init__(self, transformer: Transformer, backend: str) -> None:
        self.transformer, self.backend = transformer, backend
        self.blocks = len(transformer.blocks)
        self.graphs = 0
        #: the "compile: ..." line and its seconds, once the compiling step and the next
        #: were timed
        self.report: str | None = None
        self.seconds: float | None = None
        self._compiled_in: tuple[int, float] | None = None  # (step, seconds) that traced
        self._step = 0  # the optimizer step under way
        self._timed = 0  # steps timed so far
        self._log: Callable[[str], None] | None = None

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """The blocks run eager inside: the loop's first step, whose observers (its
        matmul-dtype watch, a test's probe) hook every layer; hooks seen while a graph is
        traced would make the next step trace it again."""
        self.transformer.use_compiled(False)
        try:
            yield
        finally:
            self.transformer.use_compiled(True)

    def counting_backend(self) -> Callable[..., Any]:
        """The torch.compile backend: `self.backend`'s compiler, counting its graphs."""
        compiler = torch._dynamo.lookup_backend(self.backend)

        def counting(graph: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
            self.graphs += 1
            done = self._compiled_in
            if done is not None and self._step != done[0] and self._log is not None:
                self._log(f"warning: --compile traced a block again ({self.graphs} graphs in "
                          "all): a recompile, each costs a compile; TORCH_LOGS=recompiles "
                          "names its cause")
            return compiler(graph, inputs)

        return counting

    @contextlib.contextmanager
    def timing(self, step: int, device: torch.device, log: Callable[[str], None]
               ) -> Iterator[None]:
        """Times optimizer step `step` until the compile is measured: the step in which the
        graphs were traced, then the next one; then logs the report, once. A timed step
        waits for the device at its start and end (two or three steps per run)."""
        if self.report is not None or self._timed > TIMED_STEPS:
            self._step = step
            yield
            return
        self._log, self._step = log, step
        _sync(device)
        graphs, started = self.graphs, time.perf_counter()
        yield
        _sync(device)
        seconds = time.perf_counter() - started
        self._timed += 1
        if self.graphs > graphs and self._compiled_in is None:
            self._compiled_in = (step, seconds)
        elif self._compiled_in is not None and self.graphs == graphs:
            first, first_s = self._compiled_in
            self.seconds = max(first_s - seconds, 0.0)
            self.report = (f"compile: {self.blocks} transformer blocks -> {self.graphs} "
                           f"graph(s) ({self.backend}) in {self.seconds:.1f} s: step {first} "
                           f"took {first_s:.2f} s, step {step} {seconds:.2f} s")
            log(self.report)
        elif self._timed > TIMED_STEPS:
            log(f"warning: --compile: no step without tracing in the first {TIMED_STEPS} "
                "steps; the compile time is not measured")

    def finish(self, log: Callable[[str], None]) -> None:
        """At the run's end, the compile line of a run too short to measure it: the
        compiling step's time, the compile included (there was no later step to subtract),
        or, for a run of one step (which runs eager), that nothing was compiled. A run
        that already logged its report, or the warning that every timed step traced, logs
        nothing more."""
        if self.report is not None or self._timed > TIMED_STEPS:
            return
        if self._compiled_in is None:
            log("--compile: nothing was compiled: the run ended after its first step, "
                "which runs eager (the blocks compile in the second)")
            return
        step, seconds = self._compiled_in
        self.report = (f"compile: {self.blocks} transformer blocks -> {self.graphs} "
                       f"graph(s) ({self.backend}): step {step} took {seconds:.2f} s, the "
                       "compile included; the run ended before a step that would measure "
                       "it alone")
        log(self.report)

    def as_dict(self) -> dict[str, Any]:
        """What was compiled and what it cost, for reports (selftest, benches)."""
        return {"backend": self.backend, "blocks": self.blocks, "graphs": self.graphs,
                "seconds": self.seconds, "report": self.report}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def no_donated_buffers() -> None:
    """Turns AOTAutograd's donated buffers off for this process's compiles.

    With them on, a compiled backward may write into a tensor the forward saved once that
    tensor's last reader has run. torch 2.13 missed a second saved tensor that views the
    same memory: in conv_like's band matmuls (the CPU's path from 16 x 16 cells) the
    softmax's backward overwrote the attention probabilities while a view of them still
    had to give the values' gradient, which came out wrong (up to 2.7x its size; the loss
    itself was right, so nothing failed). Off, the bench model's compiled step took 0.4%
    longer at full (256 image tokens) and 0.3% at axial_row (1024). Inductor's graph
    cache does not key on the setting, so a graph compiled with it on by an earlier run
    would still be served: the tag keeps this process's graphs apart from those."""
    import torch._functorch.config

    torch._functorch.config.donated_buffer = False
    tags = [tag for tag in torch.compiler.config.cache_key_tag.split(",") if tag]
    if NO_DONATED_BUFFERS_TAG not in tags:
        torch.compiler.config.cache_key_tag = ",".join([*tags, NO_DONATED_BUFFERS_TAG])


def compile_blocks(transformer: Transformer, backend: str = DEFAULT_BACKEND
                   ) -> CompiledBlocks:
    """Compile every block's training call of `transformer` in place (fullgraph, one
    torch.compile per block, torchtitan's apply_compile): before the model is wrapped or
    sharded, after activation checkpointing is set. The parameters keep their names (no
    `_orig_mod.` prefix): checkpoints of compiled and eager runs are interchangeable.
    Donated buffers go off for the process, not around this call (no_donated_buffers):
    each backward graph compiles lazily, in the first backward, and its cache lookup must
    carry the tag too."""
    no_donated_buffers()
    compiled = CompiledBlocks(transformer, backend)
    counting = compiled.counting_backend()
    transformer.compile_training(
        lambda fn: torch.compile(fn, backend=counting, fullgraph=True))
    return compiled
