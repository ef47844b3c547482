"""Known failures outside the engines' categories (other): host RAM or shared memory
exhausted, torch.compile's build tools missing (a C++ compiler, Python.h), a full disk, a
NaN loss without fp16, and dalle-dist's own `error: ... (fix)` lines. Ranks 1400s, after
every engine's entries: dalle-dist-error (1425), which reads any of dalle-dist's error
lines, decides only where nothing more specific does.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import NAN_LOSS, Signature

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "host-oom-killed", "other",
        (r"Signal 9 \(SIGKILL\) received by PID",
         r"exits with return code = -9\b",
         r"\bexitcode\W+-9\b",
         r"^Killed$",
         r"Out of memory: Killed process",
         r"is killed by signal: Killed",
         r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"),
        "a process was killed with SIGKILL, usually by the kernel's out-of-memory killer "
        "when host RAM ran out (data loader workers, --zero_offload cpu, checkpoint loading)",
        "lower --num_workers and --batch_size, drop --zero_offload cpu, or ask the scheduler "
        "for more memory",
        "dmesg -T | grep -i 'killed process'",
        priority=1400),
    # torch.compile's inductor builds its CPU kernels with a C++ compiler, as Python
    # extensions (Python.h); Triton's launcher on CUDA includes Python.h as well. A slim
    # container or a system Python without its -dev package fails at the first compile.
    Signature(
        "inductor-cxx-compiler-missing", "other",
        (r"No working C\+\+ compiler found in torch\._inductor",
         r"\bInvalidCxxCompiler\b"),
        "torch.compile's inductor found no C++ compiler: it builds its CPU kernels as C++ "
        "while the run goes on",
        "install g++ (apt-get install g++, or build-essential) or point CXX at a compiler; "
        "or run without torch.compile (dalle-dist: drop --compile, or --compile_backend "
        "aot_eager)",
        "${CXX:-g++} --version",
        priority=1401),
    Signature(
        "python-headers-missing", "other",
        (r"fatal error: '?Python\.h'?: No such file or directory",
         r"'Python\.h' file not found"),
        "a C or C++ build that includes Python.h found no Python headers: torch.compile "
        "builds its kernels (inductor on CPU, Triton's launcher on CUDA) against them, and "
        "this Python's -dev package is not installed",
        "install this Python's headers (apt-get install python3-dev, or python3.X-dev for "
        "Python 3.X; a conda or pyenv Python carries them)",
        "python -c \"import sysconfig, os; "
        "print(os.path.isfile(sysconfig.get_path('include') + '/Python.h'))\"",
        priority=1402),
    Signature(
        "disk-full", "other",
        (r"No space left on device",
         r"\[Errno 28\]",
         r"Disk quota exceeded",
         r"PytorchStreamWriter failed writing file",
         r"\bunexpected pos \d+ vs \d+",   # torch.save's writer (torch 1.x) on a full disk
         r"write\(\): fd \d+ failed with"),
        "the disk filled up (checkpoints, samples or compiled op caches)",
        "free space or point the output elsewhere; --keep_n_checkpoints limits old "
        "checkpoints",
        "df -h .",
        priority=1405),
    Signature(
        "checkpoint-file-unwritable", "other",
        (r"File .+ cannot be opened\.",),   # torch.save's PyTorchFileWriter
        "torch.save could not create its file: the disk is full, or the folder is missing "
        "or not writable",
        "free space or point the output elsewhere (--keep_n_checkpoints limits old "
        "checkpoints), and check that the output folder exists and is writable",
        "df -h .; ls -ld OUTPUT_DIR",
        priority=1410),
    Signature(
        "shared-memory-exhausted", "other",
        (r"insufficient shared memory \(shm\)",
         r"is killed by signal: Bus error",
         r"\(exitcode: -7\)",
         r"Signal 7 \(SIGBUS\) received by PID"),
        "the data loader workers ran out of shared memory (/dev/shm), which containers keep "
        "small by default",
        "run the container with --ipc=host or a larger --shm-size (Kubernetes: an emptyDir "
        "of medium Memory on /dev/shm), or lower --num_workers",
        "df -h /dev/shm",
        priority=1415),
    Signature(
        "nan-loss", "other",
        (NAN_LOSS,
         r"returned nan values in its \d+th output",
         r"Loss became infinite or NaN"),   # detectron2's trainer
        "the loss became NaN and the log shows no fp16: the learning rate is too high or a "
        "batch holds bad values (or fp16 autocast was on by default, unseen in the log)",
        "lower --learning_rate, keep --clip_grad_norm, and check the data; if the code runs "
        "under fp16 autocast, try bf16 or fp32; resume from a checkpoint saved before the NaN",
        "grep -in 'nan' LOGFILE | head",
        priority=1420),
    Signature(
        "dalle-dist-error", "other",
        (r"^error: (?P<what>.*?) \((?P<fix>(?:[^()]|\([^()]*\))*)\)$",),
        "dalle-dist stopped: {what}",
        "{fix}",
        "dalle-dist check",
        priority=1425),
)
