"""How long a save and a resume take for the small bench config on each backend.

Run it plainly: it launches itself once per backend on 2 CPU ranks (OMP_NUM_THREADS=1 each):
single (one process, 2 threads), torch DDP and FSDP (torchrun), DeepSpeed ZeRO 1, 2 and 3
(the deepspeed launcher) and Horovod (horovodrun --gloo), and prints one JSON document.

The model is backend_overhead.py's: DALL-E with 32 text tokens (byte tokenizer), 512 image
tokens from a 2-layer DiscreteVAE of 64 px images, dim 256, depth 4, 4 heads of 64; global
batch 8, fp32, built-in shapes data. Each rank builds and distributes it through dalle_dist
(DALLETask, backend.distribute) and takes 3 real optimizer steps, so the optimizer has state.
Then, in a temporary directory, with backend.barrier(name) before and after each timed region
and the median of --repeats repetitions reported (every repetition is listed too):

- save_s: checkpoint.checkpointer.Checkpointer.save, as the loop calls it (keep_n=2, a
  new step each time, so DeepSpeed writes a new tag): NAME.pt for the file backends;
  NAME-ds-cp/<tag>/ and NAME.pt for DeepSpeed (its save at a stop or the run's end).
- periodic_save_s (DeepSpeed): Checkpointer.save(periodic=True), its save every N steps:
  the tag alone, without NAME.pt and the whole-model gather it needs under ZeRO-3.
- resume_s: what a resumed run does before its first step: load_checkpoint (NAME.pt, or
  the NAME-ds-cp directory unconsolidated for DeepSpeed), rebuild config, VAE and tokenizer
  from it (dalle_parts), a fresh DALLETask with the weights loaded when the payload has
  them, distribute, then checkpoint.resume.restore_training (optimizer, scheduler, RNG,
  position). resume_phases_s splits it (rank 0's clock, medians).
- file_mb: size of NAME.pt; ds_tag_mb: DeepSpeed's newest tag directory in total.
- consolidate_s (DeepSpeed): checkpoint.deepspeed_dir.consolidated_weights on that tag
  (zero_to_fp32 for ZeRO partitions), on rank 0 alone.

After the last resume the resumed weights' digest is compared with the saved model's
(resumed_weights_match) and anything restore_training warned about is listed
(resume_warnings; empty when the optimizer state came back). Each backend gets --timeout
seconds; one that fails reports "error" with the tail of its output.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, set_threads

BIN = Path(sys.executable).parent
SCRIPT = str(Path(__file__).resolve())
TORCHRUN = [str(BIN / "torchrun"), "--nproc_per_node", "2"]
DEEPSPEED = [str(BIN / "deepspeed"), "--num_gpus", "2"]
HOROVOD = [str(BIN / "horovodrun"), "-np", "2", "--gloo", sys.executable]
#: backend -> (launcher prefix, distributed_backend, ZeRO stage)
BACKENDS: dict[str, tuple[list[str], str, int]] = {
    "single": ([sys.executable], "single", 0),
    "torch": (TORCHRUN, "torch", 0),
    "fsdp": (TORCHRUN, "fsdp", 0),
    "deepspeed-zero1": (DEEPSPEED, "deepspeed", 1),
    "deepspeed-zero2": (DEEPSPEED, "deepspeed", 2),
    "deepspeed-zero3": (DEEPSPEED, "deepspeed", 3),
    "horovod": (HOROVOD, "horovod", 0),
}
CONFIG = {"text_seq_len": 32, "tokenizer": "byte", "num_image_tokens": 512, "image_size": 64,
          "vae_layers": 2, "dim": 256, "depth": 4, "heads": 4, "dim_head": 64,
          "global_batch": 8, "precision": "fp32", "data": "shapes", "train_steps": 3}
MB = 1024 * 1024
EXCEPTION_LINE = re.compile(r"^(\[\d+\]<std\w+>:)?\w+(\.\w+)*(Error|Exception): ")


def backend_settings(name: str) -> Any:
    from dalle_dist.backends import DistributedConfig

    _, backend, stage = BACKENDS[name]
    return DistributedConfig(backend=backend, zero_stage=stage, clip_grad_norm=0.5)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rank_main(name: str, args: argparse.Namespace) -> None:
    from dalle_dist.backends import backend_from_config
    from dalle_dist.checkpoint.checkpointer import Checkpointer
    from dalle_dist.checkpoint.deepspeed_dir import (
        consolidated_weights,
        current_tag,
        ds_checkpoint_dir,
    )
    from dalle_dist.checkpoint.format import LoopState
    from dalle_dist.checkpoint.load import dalle_parts, load_checkpoint
    from dalle_dist.checkpoint.resume import restore_training
    from dalle_dist.data import CaptionCollate, DataConfig, EpochLoader, ShapesDataset
    from dalle_dist.data.tokenizer import ByteTokenizer
    from dalle_dist.model import DALLEConfig, DiscreteVAE, VAEConfig
    from dalle_dist.train.commands import model_weights
    from dalle_dist.train.config import RunPaths, TrainConfig
    from dalle_dist.train.dalle_task import DALLETask
    from dalle_dist.train.run_log import RunLog

    class CollectingLog(RunLog):
        """RunLog(None, is_root) that keeps what it would print (restore_training's warnings)."""

        def __init__(self, enabled: bool) -> None:
            super().__init__(None, enabled)
            self.messages: list[str] = []

        def info(self, message: str) -> None:
            if self.enabled:
                self.messages.append(message)

    if name == "single":
        set_threads(2)
    backend = backend_from_config(backend_settings(name))
    backend.initialize()
    is_ds = backend.name == "deepspeed"
    # --batch_size as a user would give it: global, or per worker for Horovod.
    global_batch = CONFIG["global_batch"]
    batch = global_batch if backend.batch_size_is_global else global_batch // backend.world_size
    backend.check_config(batch)
    device = backend.device
    steps = CONFIG["train_steps"]
    train_cfg = TrainConfig(epochs=1, batch_size=batch, clip_grad_norm=0.5, save_every_n_steps=0,
                            sample_every_n_steps=0, log_every_n_steps=0)

    torch.manual_seed(0)
    vae = DiscreteVAE(VAEConfig(image_size=CONFIG["image_size"],
                                num_tokens=CONFIG["num_image_tokens"],
                                num_layers=CONFIG["vae_layers"]))
    tokenizer = ByteTokenizer()
    cfg = DALLEConfig(num_text_tokens=tokenizer.vocab_size, text_seq_len=CONFIG["text_seq_len"],
                      num_image_tokens=CONFIG["num_image_tokens"],
                      image_fmap_size=vae.config.fmap_size, dim=CONFIG["dim"],
                      depth=CONFIG["depth"], heads=CONFIG["heads"], dim_head=CONFIG["dim_head"])
    dataset = ShapesDataset(steps * global_batch, CONFIG["image_size"], seed=0)
    collate = CaptionCollate(tokenizer, CONFIG["text_seq_len"], truncate=True)
    loader = EpochLoader(dataset, backend.rank_batch_size(batch), backend.rank,
                         backend.world_size, 0, 0, collate)
    data = DataConfig().to_dict()

    def distribute(task: DALLETask, payload: dict[str, Any] | None = None) -> Any:
        return backend.distribute(task.model, task.make_optimizer, task.make_scheduler,
                                  shard_units=task.shard_units(task.model), clip_grad_norm=0.5,
                                  weights=model_weights(task, payload))

    def timed(region: Any, *region_args: Any, **kwargs: Any) -> float:
        backend.barrier("bench")
        start = time.perf_counter()
        region(*region_args, **kwargs)
        backend.barrier("bench")
        return time.perf_counter() - start

    task = DALLETask(cfg, vae, tokenizer, train_cfg, data, False, device)
    n_params = sum(p.numel() for p in task.model.parameters())
    engine = distribute(task)
    for batch_data in loader.epoch(0):
        outputs = engine.forward(*task.inputs(batch_data, device))
        engine.backward(outputs["loss"])
        engine.clip_and_step(train_cfg.clip_grad_norm)
        engine.zero_grad()
    saved_digest = engine.rank_digest()  # collective for sharded engines

    result: dict[str, Any] = {"backend": name, "ranks": backend.world_size,
                              "params": n_params}
    with tempfile.TemporaryDirectory() as tmp:
        # Every rank must write into the same directory: rank 0's.
        tmp_dir = Path(backend.broadcast_object(tmp, "bench temporary directory"))
        paths = RunPaths(tmp_dir / "bench.pt")

        checkpointer = Checkpointer(paths.checkpoint, task, engine, backend, keep_n=2)
        save_times, periodic_times = [], []
        for i in range(args.repeats):
            state = LoopState(step=steps + i, epoch=0, batch=steps + i)
            save_times.append(timed(checkpointer.save, state))
        if is_ds:  # a periodic save writes the tag alone (no NAME.pt, no ZeRO-3 gather)
            for i in range(args.repeats):
                state = LoopState(step=steps + args.repeats + i, epoch=0,
                                  batch=steps + args.repeats + i)
                periodic_times.append(timed(checkpointer.save, state, periodic=True))
        del task, engine, checkpointer
        gc.collect()

        source = ds_checkpoint_dir(paths.checkpoint) if is_ds else paths.checkpoint
        resume_times: list[float] = []
        phases: dict[str, list[float]] = {"load": [], "build": [], "distribute": [],
                                          "restore": []}
        resumed: dict[str, Any] = {}
        for _ in range(args.repeats):
            resumed.clear()
            gc.collect()
            log = CollectingLog(backend.is_root)

            def resume(log: Any = log) -> None:
                marks = [time.perf_counter()]
                payload = load_checkpoint(source, "--resume", "dalle", keep_ds_dir=is_ds)
                marks.append(time.perf_counter())
                model_cfg, vae2, tokenizer2 = dalle_parts(payload)
                torch.manual_seed(train_cfg.seed)
                task2 = DALLETask(model_cfg, vae2, tokenizer2, train_cfg, data, False, device)
                marks.append(time.perf_counter())
                engine2 = distribute(task2, payload)
                marks.append(time.perf_counter())
                state = restore_training(payload, engine2, backend, train_cfg.batch_size,
                                         train_cfg.seed, log)
                marks.append(time.perf_counter())
                for phase, (a, b) in zip(phases, itertools.pairwise(marks), strict=True):
                    phases[phase].append(b - a)
                resumed.update(engine=engine2, state=state, log=log)

            resume_times.append(timed(resume))
        match = resumed["engine"].rank_digest() == saved_digest  # collective when sharded
        state = resumed["state"]

        if backend.is_root:
            result.update(
                save_s=round(statistics.median(save_times), 4),
                resume_s=round(statistics.median(resume_times), 4),
                file_mb=round(paths.checkpoint.stat().st_size / MB, 3),
                file_bytes=paths.checkpoint.stat().st_size,
                save_all_s=[round(t, 4) for t in save_times],
                resume_all_s=[round(t, 4) for t in resume_times],
                resume_phases_s={k: round(statistics.median(v), 4) for k, v in phases.items()},
                resumed_step=state.step,
                resumed_weights_match=match,
                resume_warnings=resumed["log"].messages)
        if is_ds:
            directory = ds_checkpoint_dir(paths.checkpoint)
            tag = current_tag(directory)
            if backend.is_root:
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    consolidated_weights(directory, tag, "bench")
                    times.append(time.perf_counter() - start)
                result.update(ds_tag=tag, ds_tag_mb=round(tree_bytes(directory / tag) / MB, 3),
                              ds_tag_bytes=tree_bytes(directory / tag),
                              consolidate_s=round(statistics.median(times), 4),
                              consolidate_all_s=[round(t, 4) for t in times],
                              periodic_save_s=round(statistics.median(periodic_times), 4),
                              periodic_save_all_s=[round(t, 4) for t in periodic_times])
        backend.barrier("bench")  # nobody removes the directory while rank 0 reads it
        resumed.clear()
        gc.collect()
    if backend.is_root:
        print(json.dumps(result), flush=True)
    backend.shutdown()
    sys.stdout.flush()
    os._exit(0)


def launch(name: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = BACKENDS[name][0]
    cmd = [*prefix, SCRIPT, "--rank-worker", name, f"--repeats={args.repeats}"]
    env = {**os.environ, "OMP_NUM_THREADS": "2" if name == "single" else "1"}
    # Its own session, so a timeout ends the launcher and every rank it started.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output, timed_out = output or "", True
    # horovodrun prefixes each line with the rank ("[0]<stdout>:").
    found = [line[line.index('{"backend"'):] for line in output.splitlines()
             if '{"backend"' in line]
    if timed_out:
        if found:  # measured; only the launcher's exit hung
            return {**json.loads(found[-1]), "warning": f"the launcher was killed after "
                    f"{args.timeout} s, once the result was printed"}
        return {"backend": name, "error": f"timed out after {args.timeout} s",
                "output_tail": output[-3000:]}
    if proc.returncode or not found:
        # The first exception a rank printed: the launcher's own traceback comes last.
        raised = [line for line in output.splitlines() if EXCEPTION_LINE.search(line)]
        return {"backend": name, "error": raised[0] if raised else
                f"exit status {proc.returncode}, no result line", "returncode": proc.returncode,
                "output_tail": output[-3000:]}
    return json.loads(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank-worker", choices=list(BACKENDS))
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated, of: " + ", ".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per backend")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args()
    if args.rank_worker:
        rank_main(args.rank_worker, args)
        return
    names = args.backends.split(",")
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    results = [launch(name, args) for name in names]
    emit({"bench": "checkpoint", "ranks": 2, "config": {**CONFIG, "repeats": args.repeats},
          "results": results})


if __name__ == "__main__":
    main()
