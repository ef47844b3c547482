"""Ranks that cannot talk (nccl-comm): NCCL and gloo errors, collective timeouts, Horovod
stalls, rendezvous stores; and DDP's harmless gradient-layout warning.

Ranks 1300s, below the root causes they usually follow (a rank's CUDA OOM, a collapsed
fp16 scale): the specific entries first, collective-timeout (a symptom) next, and the
catch-all nccl-error (`fallback`) last.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import BENIGN, Signature

# One all-reduce over NCCL, nothing of dalle_dist: does the wire work at all?
_NCCL_CHECK = ("NCCL_DEBUG=INFO torchrun --nproc_per_node 2 --no-python python -c \"import os, "
               "torch, torch.distributed as d; d.init_process_group('nccl'); "
               "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])); "
               "t = torch.ones(1, device='cuda'); d.all_reduce(t); print(t.item())\"")
# One all-reduce over Horovod's gloo controller, nothing of dalle_dist.
_HOROVOD_CHECK = ('horovodrun -np 2 --gloo python -c "import horovod.torch as hvd, torch; '
                  'hvd.init(); print(hvd.allreduce(torch.ones(1)))"')

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "nccl-duplicate-gpu", "nccl-comm",
        (r"Duplicate GPU detected", r"ncclInvalidUsage"),
        "two ranks use the same GPU (NCCL invalid usage)",
        "run one rank per GPU: --nproc_per_node / --num_gpus at most the GPU count, and "
        "each rank on cuda:LOCAL_RANK (dalle_dist does this; custom code must call "
        "torch.cuda.set_device(local_rank))",
        "nvidia-smi -L",
        priority=1300),
    Signature(
        "nccl-network", "nccl-comm",
        (r"unhandled system error",
         r"ncclSystemError", r"ncclInternalError",   # apart: each a literal for the prefilter
         r"NCCL WARN .*(?:[Cc]onnect|[Ss]ocket|NET/|[Tt]imeout|[Ii]nterface)",
         r"The client socket has timed out after .* while trying to connect to",
         r"Timed out after \d+ seconds waiting for clients",
         r"NCCL error in: [^,]*, internal error",
         r"RendezvousConnectionError",
         r"The connection to the C10d store has failed",
         r"RendezvousTimeoutError",
         r"\bSocket Timeout\b",
         r"Wait timeout for key",
         r"wait timeout after \d+ ?ms, keys",
         r"Timed out initializing process group in store based barrier",
         r"unable to complete a TCP connection\s*$",
         r"This is usually caused by a firewall on the remote host"),
        "NCCL could not set up or use the network between ranks (wrong interface, "
        "firewall, unreachable MASTER_ADDR, or no shared memory in a container)",
        "rerun with NCCL_DEBUG=INFO; set NCCL_SOCKET_IFNAME to the interface the nodes share, "
        "open the ports between nodes, and in Docker use --ipc=host or a larger --shm-size; "
        "NCCL_IB_DISABLE=1 if InfiniBand is misconfigured",
        _NCCL_CHECK,
        priority=1305),
    Signature(
        "dalle-dist-peer-lost", "nccl-comm",
        (r"error: rank (?P<rank>\d+) waited (?P<waited>\d+) s in (?P<where>.+?) for the other "
         r"ranks; a rank died, hung or took another path",),
        "rank {rank} waited {waited} s in {where} for the other ranks, and "
        "--collective_timeout (or a closed connection) ended the wait: another rank died, "
        "hung (stopped, deadlocked, swapping) or ran a different path",
        "find the rank that failed first (its own error line, a traceback, an OOM kill) and "
        "fix that, then continue with the same command and --resume auto; if nothing failed "
        "and the wait was legitimately long (a huge checkpoint on a slow disk), raise "
        "--collective_timeout",
        "grep -nE 'error:|Traceback|Killed|exit ?code' LOGFILE | head",
        priority=1310),
    Signature(
        "horovod-stall", "nccl-comm",
        (r"One or more tensors were submitted to be reduced, gathered or broadcasted by "
         r"subset of ranks",
         r"One or more rank \(marked by \"!\"\) is stalled for longer than",
         r"^Stalled ranks:"),
        "Horovod's stall inspector saw some ranks wait for a tensor the others never "
        "submitted: a rank hung or died, or the ranks ran different steps (different data "
        "lengths, a collective inside a rank-0-only branch)",
        "look for the rank that failed first; make every rank run the same collectives in "
        "the same order; HOROVOD_STALL_CHECK_TIME_SECONDS and "
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS set when Horovod warns and gives up "
        "(dalle-dist sets them from --collective_timeout)",
        _HOROVOD_CHECK,
        priority=1315),
    Signature(
        "horovod-shut-down", "nccl-comm",
        (r"Horovod has been shut down\. This was caused by an exception on one of the ranks",),
        "Horovod shut down while this rank still called a collective: another rank raised, "
        "died, stalled past the stall shutdown time, or finished early (an early stop or "
        "fewer batches on one rank)",
        "find the first rank's own error above the first shutdown message; make every rank "
        "run the same number of steps and stop together",
        _HOROVOD_CHECK,
        priority=1320),
    Signature(
        "gloo-timeout", "nccl-comm",
        (r"Timed out waiting \d+ ?ms for (?:recv|send) operation to complete",
         r"gloo/transport/tcp/\w+\.(?:cc|h):\d+\].*(?:Connection (?:closed|reset) by peer|"
         r"Timed out|Connect timeout|Connection refused)",
         r"Gloo connectFullMesh failed",
         r"gloo::IoException",
         r"gloo::EnforceNotMet"),
        "a gloo collective (CPU training, or Horovod's coordination over gloo) waited past its "
        "timeout or lost its connection: another rank stopped, hung or died",
        "look for the rank that failed first; if none did and the wait was legitimately long, "
        "raise the timeout (dalle-dist: --collective_timeout)",
        "torchrun --nproc_per_node 2 --no-python python -c \"import torch, torch.distributed "
        "as d; d.init_process_group('gloo'); t = torch.ones(1); d.all_reduce(t); "
        "print(t.item())\"",
        priority=1325),
    # DDP's reducer warns when a parameter's grad layout differs from its bucket (channels-
    # last convolutions): "This is not an error, but may impair performance".
    Signature(
        "ddp-grad-strides-mismatch", BENIGN,
        (r"Grad strides do not match bucket view strides",),
        "DDP copies gradients whose memory layout (strides) differs from its buckets: "
        "slower at most, training is correct",
        "nothing; make the parameters contiguous (or the model channels_last before DDP) "
        "only for speed",
        "grep -n 'Grad strides' LOGFILE",
        benign=True,
        priority=1330),
    Signature(
        "collective-timeout", "nccl-comm",
        (r"Watchdog caught collective operation timeout",
         # the same line hard-wrapped in a paste ("collective opera" / "tion timeout")
         r"Watchdog caught collective\s*(?:o|op|ope|oper|opera|operat|operati|operatio)?$",
         r"NCCL communicator was aborted",
         r"ncclRemoteError",
         r"remote process exiting prematurely",
         r"Connection (?:closed|reset) by peer",
         r"Heartbeat monitor timed out",
         r"ProcessGroupNCCL's watchdog got stuck",
         r"Some NCCL operations have failed or timed out",
         r"Exception \(either an error or timeout\) detected by watchdog"),
        "a collective never completed: a rank hung, died, or ran different steps than the "
        "others (a follow-on of another rank's failure when one is in the log)",
        "look for the first failing rank's own error; else check that every rank sees the "
        "same data length and network, and rerun with NCCL_DEBUG=INFO "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
        _NCCL_CHECK,
        priority=1335),
    Signature(
        "nccl-error", "nccl-comm",
        (r"NCCL error in: ",
         r"\bncclUnhandledCudaError\b", r"\bncclInvalidArgument\b",
         r"DistBackendError",
         r"\bNCCL WARN\b"),
        "NCCL failed between the ranks (its warnings name the step: topology, shared "
        "memory, network, or a CUDA call inside NCCL)",
        "rerun with NCCL_DEBUG=INFO and read the first NCCL WARN; in Docker use --ipc=host "
        "or a larger --shm-size; set NCCL_SOCKET_IFNAME to the interface the nodes share",
        _NCCL_CHECK,
        fallback=True,
        priority=1340),
)
