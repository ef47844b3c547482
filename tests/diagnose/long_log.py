"""A long multi-rank training log, as long runs write them: the input of doctor's speed bench
(bench/doctor_speed.py) and of the prefilter test (test_doctor_prefilter.py).

DeepSpeed step and timer lines under its logger prefix, tqdm bars, `[rankN]:` prefixed NCCL
INFO lines, warm-up OVERFLOW lines, then one rank's CUDA OOM traceback and the other ranks'
watchdog timeouts at the end (doctor should answer cuda-oom). Every line differs, as in
real runs, in its numbers (steps, times, ranks); `distinct` also appends a different hex
word to every line (a log whose lines differ in letters too, e.g. run ids or file hashes).
"""

from __future__ import annotations


def long_log(lines: int, distinct: bool = False) -> str:
    out: list[str] = []
    for i in range(lines - 12):
        kind = i % 5
        if kind == 0:
            out.append(f"[2026-03-01 12:{i // 6000 % 60:02d}:{i // 100 % 60:02d},{i % 1000:03d}] "
                       f"[INFO] [logging.py:128:log_dist] [Rank 0] step={i}, skipped=3, "
                       f"lr=[0.0003], mom=[(0.9, 0.999)]")
        elif kind == 1:
            out.append(f"[rank{i % 8}]:node{i % 4}:{1000 + i % 97}:{2000 + i % 89} [{i % 8}] "
                       f"NCCL INFO Channel {i % 32:02d}/0 : {i % 8}[{i % 8}] -> "
                       f"{(i + 1) % 8}[{(i + 1) % 8}] via P2P/IPC/read")
        elif kind == 2:
            out.append(f"DALL-E epoch {i // 20000}:  {i % 100:2d}%|####      | {i}/{lines} "
                       f"[01:{i % 60:02d}<02:10, 7.{i % 10}it/s, loss={5 + (i % 997) / 1000:.3f}]")
        elif kind == 3:
            out.append(f"[2026-03-01 12:00:{i % 60:02d},{i % 1000:03d}] [INFO] "
                       f"[timer.py:264:stop] epoch=0/micro_step={i}/global_step={i}, "
                       f"RunningAvgSamplesPerSec={100 + i % 13}.5, "
                       f"CurrSamplesPerSec={99 + i % 7}.1")
        elif i < 60:
            scale = 2 ** (16 - i // 5)
            out.append(f"[2026-03-01 12:00:00,{i:03d}] [INFO] [loss_scaler.py:183:update_scale] "
                       f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
                       f"{scale}, reducing to {scale // 2}")
        else:
            out.append(f"  batch {i}: tokens {i * 256} images {i * 4} text_len 256")
        if distinct:
            out[-1] += f" id={i * 2654435761 % 2**32:08x}"
    out += [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/opt/dalle_dist/train/loop.py", line 212, in optimizer_step',
        "[rank0]:     loss.backward()",
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. "
        "GPU 0 has a total capacity of 39.39 GiB of which 412.19 MiB is free.",
    ]
    out += [f"[rank{r}]:[E301 12:31:07.123 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog "
            f"caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran "
            f"for 600001 milliseconds before timing out." for r in range(1, 8)]
    out.append("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:")
    return "\n".join(out) + "\n"
