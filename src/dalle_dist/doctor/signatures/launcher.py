"""A wrong launcher or command line (launcher-args), and torchrun's harmless thread notice.

Ranks 1200s: local-rank-unrecognized (1200) before the generic bad-arguments (1205), which
matches the same `unrecognized arguments` line. The notice ranks with the other harmless
warnings (1500s).
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import BENIGN, Signature

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "local-rank-unrecognized", "launcher-args",
        (r"[Ee]rror: unrecognized arguments: .*--local[_-]rank",
         # transformers' parser, given torchrun's --local-rank
         r"arguments are not used by the HfArgumentParser: .*--local[_-]rank"),
        "the launcher passes --local_rank (deepspeed, torch.distributed.launch) but the "
        "script's parser does not accept it",
        "launch dalle_dist as a module (deepspeed --module dalle_dist train ..., torchrun -m "
        "dalle_dist train ...), which accepts --local_rank/--local-rank; in a custom script "
        "add parser.add_argument('--local_rank', '--local-rank', type=int)",
        "dalle-dist --local_rank=0 train --help",
        priority=1200),
    Signature(
        "bad-arguments", "launcher-args",
        (r"[Ee]rror: unrecognized arguments:",
         r"Some specified arguments are not used by the HfArgumentParser",
         r"error: the following arguments are required:",
         r"error: argument [-\w/]+: (?:invalid|expected|ambiguous)",
         r"error: ambiguous option:",
         r"unknown --distributed_backend",
         r"--deepspeed contradicts --distributed_backend"),
        "a command line (the launcher's or dalle-dist's) has an unknown, missing or invalid "
        "argument",
        "fix the argument the error line names; launcher flags go before the module "
        "(torchrun --nproc_per_node 2 -m dalle_dist train ...)",
        "dalle-dist train --help",
        priority=1205),
    Signature(
        "no-launcher-environment", "launcher-args",
        (r"environment variable (?P<var>RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) "
         r"expected, but not set",
         r"found no launcher environment",
         r"KeyError: '(?P<var2>RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK)'"),
        "a distributed backend was asked for without the launcher that sets up its ranks",
        "start it through its launcher: torchrun --nproc_per_node N -m dalle_dist train "
        "--distributed_backend torch ...; deepspeed --num_gpus N --module dalle_dist train "
        "--deepspeed ...; horovodrun -np N python -m dalle_dist train --distributed_backend "
        "horovod ...",
        "env | grep -E '^(RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)='",
        priority=1210),
    Signature(
        "port-in-use", "launcher-args",
        (r"(?i)address already in use", r"EADDRINUSE", r"errno: 98\b"),
        "the rendezvous port (MASTER_PORT, 29500 by default) is taken, often by a previous "
        "run that did not exit",
        "pick another port (torchrun --master_port 29501, deepspeed --master_port 29501) or "
        "end the leftover processes",
        'ss -ltnp | grep -w "${MASTER_PORT:-29500}"',
        priority=1215),
    Signature(
        "torchrun-omp-threads", BENIGN,
        (r"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",),
        "torchrun set OMP_NUM_THREADS=1 per process: a tuning notice, not an error",
        "nothing; export OMP_NUM_THREADS yourself to choose the value",
        "echo $OMP_NUM_THREADS",
        benign=True,
        priority=1510),
)
