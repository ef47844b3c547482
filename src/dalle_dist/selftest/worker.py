"""What runs inside a rank process of `dalle-dist selftest`: training runs and resume
phases, started as `python -m dalle_dist.selftest.worker SPECS.json`.

Started plainly (`single`), under `deepspeed --num_gpus 1 --module` or under `torchrun
--nproc_per_node 1 -m` (`fsdp`), with a JSON file of specs; it runs them one after
another in this process (the launcher's start-up, seconds on a GPU machine, is paid once
per group) and writes one JSON result per spec to the file the spec names (rank 0 only).
A spec that raises reports its error instead, and the next still runs.

A training run goes through dalle_dist's own parts: backend_from_config, the backend's
engine, the built-in shapes through make_loader, DALLETask and the one loop
(train/loop.py), so a change to any of them (a sync-free step, FSDP2 mixed precision,
pinned batches) shows here without an edit; only the timing is wrapped around it. A
resume phase is a `dalle-dist train` command line run by dalle_dist.cli.main, the whole
command as a user runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import re
import shutil
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dalle_dist.cli.parser import add_launcher_rank
from dalle_dist.selftest.mfu import training_flops_per_step
from dalle_dist.selftest.models import fresh_vae, model_configs
from dalle_dist.selftest.step_profile import profile_step

#: What torch.cuda.set_sync_debug_mode("warn") says at each synchronizing CUDA call.
SYNC_WARNING = "called a synchronizing CUDA operation"


def make_backend(spec: dict[str, Any]) -> Any:
    """The backend of a spec, joined (joining twice in one process is a no-op)."""
    from dalle_dist.backends import DistributedConfig
    from dalle_dist.backends.registry import backend_from_config

    # On CUDA the backend picks the rank's own GPU (cuda:LOCAL_RANK), as `train` does.
    settings = DistributedConfig(backend=spec["backend"], precision=spec["precision"],
                                 zero_stage=spec.get("zero_stage") or 0,
                                 device=None if spec["device"] == "cuda" else spec["device"],
                                 clip_grad_norm=spec["clip"])
    backend = backend_from_config(settings)
    backend.initialize()
    backend.check_config(spec["batch"])
    return backend


def global_batch(spec: dict[str, Any], backend: Any) -> int:
    """Samples per optimizer step over all ranks (Horovod's --batch_size is per rank)."""
    return spec["batch"] * (1 if backend.batch_size_is_global else backend.world_size)


def make_task_parts(spec: dict[str, Any], backend: Any, steps: int) -> tuple[Any, ...]:
    """(train config, data config, tokenizer, collate, DALL-E config, VAE) of a spec."""
    from dalle_dist.data import CaptionCollate, DataConfig
    from dalle_dist.data.tokenizer import ByteTokenizer
    from dalle_dist.train.config import TrainConfig

    dalle_cfg, vae_cfg = model_configs(spec["model"])
    train_cfg = TrainConfig(epochs=1, batch_size=spec["batch"], learning_rate=1e-3,
                            clip_grad_norm=spec["clip"], save_every_n_steps=0,
                            sample_every_n_steps=0, log_every_n_steps=spec["log_every"],
                            seed=spec.get("seed", 42))
    data_cfg = DataConfig(image_size=vae_cfg.image_size,
                          shapes_count=steps * global_batch(spec, backend))
    tokenizer = ByteTokenizer()
    collate = CaptionCollate(tokenizer, dalle_cfg.text_seq_len, truncate=True)
    return train_cfg, data_cfg, tokenizer, collate, dalle_cfg, fresh_vae(vae_cfg)


def rank_loader(spec: dict[str, Any], backend: Any, train_cfg: Any, data_cfg: Any,
                collate: Any, workers: int = 0) -> Any:
    """This rank's loader as `train` builds it (pinned on CUDA)."""
    from dalle_dist.data import make_loader

    loader, _ = make_loader(data_cfg, data_cfg.image_size,
                            backend.rank_batch_size(train_cfg.batch_size), backend.rank,
                            backend.world_size, train_cfg.seed, collate, True,
                            num_workers=workers, pin_memory=backend.device.type == "cuda")
    return loader


# -- training runs ------------------------------------------------------------------------


@dataclass
class StepClock:
    """Per-step host time and host syncs, read at each Task.after_step.

    Window j runs from after_step(j - 1) to after_step(j): step j's forward, backward and
    optimizer step, plus whatever the loop did after step j - 1 (its loss read, its
    metrics line when j - 1 was a logging step). The timed region starts and ends with a
    device synchronize of our own, made with the sync debug mode off so it is not counted.
    """

    warmup: int
    steps: int
    cuda: bool
    records: list[warnings.WarningMessage] = field(default_factory=list)
    syncs: dict[int, int] = field(default_factory=dict)
    started: float = 0.0
    elapsed: float = 0.0
    _seen: int = 0
    tf32: bool | None = None

    def _sync_count(self) -> int:
        return sum(1 for w in self.records if SYNC_WARNING in str(w.message))

    def after_step(self, step: int) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            count = self._sync_count()
            if step > self.warmup:
                self.syncs[step] = count - self._seen
            self._seen = count
        if step == self.warmup:
            self.tf32 = (torch.backends.cuda.matmul.allow_tf32
                         or torch.get_float32_matmul_precision() != "highest")
            if self.cuda:
                torch.cuda.synchronize()
            self.started = time.perf_counter()
        if step == self.steps:
            if self.cuda:
                torch.cuda.synchronize()
            self.elapsed = time.perf_counter() - self.started
            return
        if self.cuda and step >= self.warmup:
            torch.cuda.set_sync_debug_mode("warn")


def measured_task(base: type, clock: StepClock) -> type:
    """DALLETask with the clock at each step, remembering the last batch's inputs (the
    matmul dtypes are read from one more forward of them)."""

    class Measured(base):  # type: ignore[misc, valid-type]
        last_inputs: tuple[Any, ...] | None = None

        def inputs(self, batch: Any, device: torch.device, *args: Any,
                   **kwargs: Any) -> tuple[Any, ...]:
            self.last_inputs = super().inputs(batch, device, *args, **kwargs)
            return self.last_inputs

        def after_step(self, step: int, engine: Any) -> None:
            super().after_step(step, engine)
            clock.after_step(step)

    return Measured


def record_grad_norms(engine: Any) -> list[torch.Tensor]:
    """Every optimizer step's pre-clip gradient norm, kept on the device (no read back
    until the run ends): what the multi-GPU checks compare with one process, since Adam
    and clipping hide a gradient off by a constant factor in the weights."""
    norms: list[torch.Tensor] = []
    step = engine.clip_and_step

    def recording(max_norm: float | None) -> torch.Tensor | None:
        norm = step(max_norm)
        if norm is not None:
            norms.append(norm.detach().float().reshape(()).clone())
        return norm

    engine.clip_and_step = recording
    return norms


def plain_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of a state dict, on the CPU in fp32, under the unwrapped model's names (a
    copy: the initial weights of a CPU run would otherwise be the trained parameters)."""
    def name(key: str) -> str:
        for prefix in ("module.", "_orig_mod."):
            key = key.removeprefix(prefix)
        return key

    return {name(k): v.detach().to("cpu", torch.float32, copy=True) for k, v in state.items()
            if isinstance(v, torch.Tensor)}


def logged_losses(metrics: Path) -> list[float]:
    if not metrics.exists():
        return []
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if line]


def train_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One backend x precision: `steps` optimizer steps of the loop, timed after `warmup`
    (spec "compile": the blocks compiled with that torch.compile backend, as train
    --compile does; they compile at step 2, inside the warm-up)."""
    import tempfile

    from dalle_dist.backends.precision import matmul_dtypes
    from dalle_dist.checkpoint.checkpointer import Checkpointer
    from dalle_dist.data.loader import default_num_workers
    from dalle_dist.train.commands import distribute
    from dalle_dist.train.config import RunPaths
    from dalle_dist.train.dalle_task import DALLETask
    from dalle_dist.train.loop import train
    from dalle_dist.train.run_log import RunLog

    steps, warmup = spec["steps"], spec["warmup"]
    backend = make_backend(spec)
    device = backend.device
    cuda = device.type == "cuda"
    if cuda:
        # A plain `single` process has not touched CUDA yet: its caching allocator exists
        # only after the lazy init, and resetting its stats before that is an error
        torch.cuda.init()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base_bytes = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    train_cfg, data_cfg, tokenizer, collate, dalle_cfg, vae = make_task_parts(spec, backend,
                                                                              steps)
    # loader processes as `dalle-dist train` picks them (none on the CPU): rendering the
    # shapes in this process would put the renderer's time into the step's
    workers = spec.get("workers", default_num_workers(
        device, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    loader = rank_loader(spec, backend, train_cfg, data_cfg, collate, workers)
    clock = StepClock(warmup, steps, cuda)
    task = measured_task(DALLETask, clock)(dalle_cfg, vae, tokenizer, train_cfg,
                                           data_cfg.to_dict(), False, device,
                                           precision=backend.precision(),
                                           compile_backend=spec.get("compile"))
    weights_out = spec.get("weights_out")
    # The model is built on the meta device; `distribute` fills it as `train` does.
    initial = plain_names(dict(task.initial_weights())) if weights_out else None
    engine = distribute(task, backend, train_cfg)
    norms = record_grad_norms(engine)

    class NoSaves(Checkpointer):
        """Throughput runs write nothing: the resume check covers saving."""

        def save(self, state: Any, **kwargs: Any) -> None:
            pass

    with tempfile.TemporaryDirectory() as tmp:
        paths = RunPaths(Path(tmp) / "run.pt")
        log = RunLog(paths.metrics, backend.is_root)
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            clock.records = records
            train(task, engine, backend, loader, train_cfg, paths, log,
                  checkpointer=NoSaves(paths.checkpoint, task, engine, backend))
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
        losses = logged_losses(paths.metrics)
    with torch.no_grad(), matmul_dtypes(engine.module) as seen:
        engine.forward(*task.last_inputs)
    # spec "profile": one more step under torch.profiler (figures compile's eager and
    # compiled runs), after the timed ones so it costs them nothing
    profiled = profile_step(engine, task.last_inputs, device) if spec.get("profile") else None
    if weights_out:  # collective under FSDP: every rank asks, the root writes
        final = engine.full_state_dict()
        if backend.is_root and final is not None:
            torch.save({"initial": initial, "final": plain_names(final)}, weights_out)
    timed, world = steps - warmup, backend.world_size
    samples = global_batch(spec, backend)
    result: dict[str, Any] = {
        "steps": steps, "timed_steps": timed, "batch": samples, "world_size": world,
        "parameters": sum(p.numel() for p in task.model.parameters()),
        "samples_per_s": round(timed * samples / clock.elapsed, 2),
        "step_s": round(clock.elapsed / timed, 5),
        "logged_losses": [round(x, 4) for x in losses],
        "grad_norms": torch.stack(norms).tolist() if norms else [],
        "matmul_dtypes": sorted(str(d).removeprefix("torch.") for d in seen),
        "tf32": clock.tf32, "loader_workers": workers, "backend": backend,
    }
    if weights_out:
        result["weights"] = weights_out
    if task.compiled is not None:  # train --compile's blocks: graphs and compile time
        result["compile"] = task.compiled.as_dict()
    if profiled is not None:
        result["profile"] = profiled
    flops = training_flops_per_step(dalle_cfg, samples) * timed
    # MFU against the peak of the dtype the matmuls ran in (fp32 runs count TF32's when
    # on), per GPU: the job's FLOPs over `world` devices' peaks
    peak_name = spec["precision"] if spec["precision"] != "fp32" else "tf32" if clock.tf32 \
        else "fp32"
    peak = spec.get("peaks", {}).get(peak_name)
    if peak:
        result["achieved_tflops"] = round(flops / clock.elapsed / 1e12, 3)
        result["mfu"] = round(flops / clock.elapsed / (peak * world), 4)
        result["mfu_peak"] = peak_name
    if cuda:
        result["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base_bytes
        log_windows = {s + 1 for s in range(steps) if s and s % train_cfg.log_every_n_steps == 0}
        quiet = [n for step, n in clock.syncs.items() if step not in log_windows]
        result["syncs_by_step"] = clock.syncs
        result["syncs_quiet_step_max"] = max(quiet, default=0)
        result["syncs_quiet_step_median"] = sorted(quiet)[len(quiet) // 2] if quiet else 0
    return result


# -- resume phases --------------------------------------------------------------------------


@contextlib.contextmanager
def sigterm_after_step(stop_at: int | None) -> Iterator[None]:
    """While inside, every DALLETask sends this process SIGTERM after step `stop_at`:
    a preemption at a known step, which the loop answers as it answers a scheduler's
    (finish the step, save, stop). None: no stop. A signal from another process would
    land on whatever step the run had reached (a CPU step takes milliseconds), and the
    check must know which step the resumed run continues from."""
    from dalle_dist.train.dalle_task import DALLETask

    if stop_at is None:
        yield
        return
    own = "after_step" in vars(DALLETask)
    original = DALLETask.after_step

    def after_step(self: DALLETask, step: int, engine: Any) -> None:
        original(self, step, engine)
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    DALLETask.after_step = after_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own:
            DALLETask.after_step = original  # type: ignore[method-assign]
        else:
            del DALLETask.after_step


def resume_phase(spec: dict[str, Any]) -> dict[str, Any]:
    """One phase of the resume check: its `dalle-dist train` command line (spec["argv"])
    through dalle_dist.cli.main. "straight" trains all steps; "interrupted" gets SIGTERM
    after step `stop_at`; "resumed" continues it (--resume auto). Returns where the final
    weights are (the run's NAME.pt), whether the run said it stopped, and the step it
    said it resumed at."""
    from dalle_dist.cli import main as dalle_dist_main

    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                    deterministic(spec.get("deterministic", False)), \
                    sigterm_after_step(spec.get("stop_at")):
                status = dalle_dist_main(spec["argv"])
        finally:  # the run's own output, in the rank's, for a reader of a failure
            sys.stdout.write(out.getvalue())
            sys.stderr.write(err.getvalue())
    said = out.getvalue()
    if status != 0:
        raise RuntimeError(f"dalle-dist {' '.join(spec['argv'][:1])} exited {status}: "
                           f"{(err.getvalue() or said)[-1000:]}")
    resumed = re.search(r"^resuming .* at step (\d+)", said, re.MULTILINE)
    result = {"phase": spec["phase"], "checkpoint": spec["output"],
              "stopped": "stopped by SIGTERM after step" in said,
              "resumed_from_step": int(resumed.group(1)) if resumed else None,
              "nondeterministic_ops": sorted({m.group(1) for w in records
                                              if (m := NONDETERMINISTIC.search(str(w.message)))})}
    if spec.get("stop_at") is not None and result["stopped"]:
        # the weights at the stop, before the resumed run overwrites NAME.pt: how far the
        # resumed part of training moved them is the scale a resume's error is judged on
        stopped = Path(spec["output"]).with_suffix(".at-stop.pt")
        shutil.copyfile(spec["output"], stopped)
        result["checkpoint_at_stop"] = str(stopped)
    return result


#: What torch warns when an op without a deterministic implementation runs in
#: deterministic mode with warn_only (the op's name is the first word).
NONDETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")


@contextlib.contextmanager
def deterministic(enabled: bool) -> Iterator[None]:
    """Repeatable CUDA training for the resume phases: deterministic algorithms (cuBLAS
    with a fixed workspace, set by the caller's CUBLAS_WORKSPACE_CONFIG), cuDNN without
    autotuning, and attention through SDPA's math kernel, whose backward is deterministic
    (flash and memory-efficient attention accumulate their gradients with atomics, and
    warn_only lets them run). warn_only stays on: an op that has no deterministic form
    (NLLLoss's forward sum on CUDA) runs and is named in the result instead of ending
    the run; resume.py then judges within a tolerance, not bit for bit."""
    if not enabled:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2:]


# -- a hung peer ------------------------------------------------------------------------------


def hung_peer_run(spec: dict[str, Any]) -> dict[str, Any]:
    """`dalle-dist train` on every rank, rank spec["victim"] stopping itself (SIGSTOP, a
    hung peer: its sockets stay open, so nothing reports it dead) after step
    spec["stop_at"], once it has written the monotonic time of the stop to
    spec["stopped_file"] (with its pid: a stopped process outlives its launcher's kill of
    the session, so the selftest kills it). The others must end with the one-line error
    naming their wait
    within --collective_timeout; the selftest reads that line from the launch's output, so
    this returns only on a rank that (wrongly) finished the run."""
    from dalle_dist.cli import main as dalle_dist_main
    from dalle_dist.train.dalle_task import DALLETask

    rank = int(os.environ.get("RANK", "0"))
    original = DALLETask.after_step

    def after_step(self: DALLETask, step: int, engine: Any) -> None:
        original(self, step, engine)
        if step == spec["stop_at"] and rank == spec["victim"]:
            Path(spec["stopped_file"]).write_text(f"{time.monotonic()} {os.getpid()}")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSTOP)

    DALLETask.after_step = after_step  # type: ignore[method-assign]
    status = dalle_dist_main(spec["argv"])
    return {"exit_status": status, "rank": rank}


KINDS = {"train": train_run, "resume": resume_phase, "hung_peer": hung_peer_run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", help="JSON file: a list of specs")
    add_launcher_rank(parser)  # the deepspeed launcher adds --local_rank
    args = parser.parse_args()
    specs = json.loads(Path(args.specs).read_text())
    rank = int(os.environ.get("RANK", "0"))
    backend = None
    for spec in specs:
        started = time.perf_counter()
        try:
            result = {"ok": True, **KINDS[spec["kind"]](spec)}
            backend = result.pop("backend", backend)
        except Exception as exc:  # reported, and the next spec still runs
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.perf_counter() - started, 2)
        if rank == 0:
            Path(spec["result"]).write_text(json.dumps(result, default=str))
    if backend is not None:
        backend.shutdown()  # DeepSpeed's also removes its /dev/shm buffers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # DeepSpeed's and gloo's threads can hold a clean exit for seconds


if __name__ == "__main__":
    main()
