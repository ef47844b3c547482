"""GPUs that ran out of memory (cuda-oom) or that torch cannot use (cuda-unavailable-or-mismatch).

The out-of-memory entry ranks 200, just after the fp16 collapse: a rank's OOM is the root
cause of the other ranks' NCCL timeouts (1300s). The CUDA entries rank 300s.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import Signature

_TORCH_ENV = ('python -c "import torch; print(torch.__version__, torch.version.cuda, '
              'torch.cuda.is_available(), torch.cuda.device_count())"')

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "cuda-out-of-memory", "cuda-oom",
        (r"CUDA out of memory\. Tried to allocate (?P<size>[\d.]+ [KMGT]iB)",
         r"OutOfMemoryError: CUDA out of memory",
         r"CUDA error: out of memory",
         r"Cuda failure '?out of memory'?",
         r"CUBLAS_STATUS_ALLOC_FAILED",
         r"CUDA out of memory\.",
         r"CUDA_ERROR_OUT_OF_MEMORY",
         r"Failed to CUDA calloc \d+ bytes",
         r"(?:HIP|MPS backend) out of memory"),   # torch on ROCm and Apple GPUs
        "a GPU ran out of memory",
        "lower --batch_size (or raise --ga_steps to keep the global batch), "
        "train in bf16/fp16, "
        "shard states with --zero_stage 2 or 3 (or --zero_offload cpu), or shrink "
        "--dim/--depth; if much memory is reserved but unallocated, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; for generate lower --batch_size",
        "nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv",
        priority=200),
    Signature(
        "torch-cpu-build", "cuda-unavailable-or-mismatch",
        (r"Torch not compiled with CUDA enabled",),
        "this torch is a CPU-only build, so CUDA cannot be used",
        "install a CUDA build of torch (pip install torch --index-url "
        "https://download.pytorch.org/whl/cu124, matching your driver), or run on CPU "
        "(--device cpu, --precision bf16)",
        _TORCH_ENV,
        priority=300),
    Signature(
        "nvidia-driver-missing", "cuda-unavailable-or-mismatch",
        (r"Found no NVIDIA driver on your system",
         r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
        "no NVIDIA driver is loaded on this machine (or in this container)",
        "install the NVIDIA driver; in Docker run with --gpus all and the NVIDIA container "
        "toolkit",
        "nvidia-smi",
        priority=305),
    Signature(
        "nvidia-driver-too-old", "cuda-unavailable-or-mismatch",
        (r"NVIDIA driver on your system is too old \(found version (?P<found>\d+)\)",
         r"CUDA driver version is insufficient for CUDA runtime version"),
        "the NVIDIA driver is older than the CUDA runtime this torch was built with",
        "update the driver, or install a torch built for an older CUDA "
        "(https://pytorch.org/get-started/locally/)",
        "nvidia-smi  # 'CUDA Version' must be >= torch.version.cuda",
        priority=310),
    Signature(
        "gpu-arch-unsupported", "cuda-unavailable-or-mismatch",
        (r"no kernel image is available for execution on the device",
         r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation",
         r"PyTorch no longer supports this GPU because it is too old"),
        "this torch build has no kernels for this GPU's architecture (compute capability)",
        "install a torch wheel built for this GPU (a newer CUDA build for new GPUs); for "
        "DeepSpeed ops rebuild them with TORCH_CUDA_ARCH_LIST set to this GPU's capability",
        'python -c "import torch; print(torch.cuda.get_arch_list(), '
        'torch.cuda.get_device_capability())"',
        priority=315),
    Signature(
        "no-gpu-visible", "cuda-unavailable-or-mismatch",
        (r"No CUDA GPUs are available",
         r"CUDA initialization: CUDA unknown error",
         r"ProcessGroupNCCL is only supported with GPUs, no GPUs found",
         r"torch\.cuda\.is_available\(\)[\s:=>-]*False",
         r"CUDA driver initialization failed, you might not have a CUDA gpu",
         r"CUDA-capable device\(s\) is/are busy or unavailable",
         r"Attempting to deserialize object on a CUDA device but torch\.cuda\.is_available"),
        "torch sees no usable GPU: CUDA_VISIBLE_DEVICES hides them, the container has none, "
        "the driver did not initialise, or the GPUs are in exclusive mode and taken",
        "check CUDA_VISIBLE_DEVICES and that the job (docker --gpus all, Slurm --gres=gpu:N) "
        "was given GPUs; on CPU use --precision bf16 and the gloo-based backends",
        "dalle-dist check --cuda-smoke",
        priority=320),
    Signature(
        "cuda-is-available-false", "cuda-unavailable-or-mismatch",
        (r"^\s*(?:>>> )?(?:returns? |returned |-> ?)?False\s*$",),
        "torch.cuda.is_available() printed False: torch sees no GPU (a CPU-only build, no "
        "driver, or a driver older than the torch wheel's CUDA)",
        "compare nvidia-smi's CUDA version with torch.version.cuda and install the matching "
        "torch wheel (or update the driver); in containers pass --gpus all",
        _TORCH_ENV,
        requires=(r"torch\.cuda\.is_available\(\)",),
        priority=325),
    Signature(
        "libcudart-missing", "cuda-unavailable-or-mismatch",
        (r"lib(?:cudart|cublas|cudnn)\S*\.so[.\d]*: cannot open shared object file",),
        "a CUDA runtime library that torch or an engine was built against is missing",
        "install the matching CUDA runtime (or a torch wheel that bundles it) and rebuild "
        "the engine against the installed torch",
        _TORCH_ENV,
        priority=330),
    Signature(
        "fp16-without-gpu", "cuda-unavailable-or-mismatch",
        (r"DeepSpeed cannot train fp16 on CPU",
         r"Type fp16 is not supported on your device",
         # Composer's "Precision.AMP_BF16 is not supported for CPU training", and alike
         r"(?i)(?:fp16|bf16|amp|half)\w*(?: mixed)?(?: precision)? is not supported "
         r"(?:for|on) (?:the )?CPU\b"),
        "fp16 (or GPU mixed precision) was asked for but the run is on CPU (no usable GPU)",
        "use --precision bf16 on CPU; if a GPU was expected, find out why torch sees none",
        "dalle-dist check --backend deepspeed --precision fp16",
        priority=335),
    Signature(
        "bf16-unsupported", "cuda-unavailable-or-mismatch",
        (r"this GPU has no bf16", r"Type bf16 is not supported on your device",
         # transformers' TrainingArguments ("Your setup doesn't support bf16/gpu"), vLLM,
         # torch.cuda.is_bf16_supported() checks in training scripts
         r"(?i)\b(?:does ?n[o']t|does not|not) support (?:bf16|bfloat16)\b",
         r"(?i)\bbfloat16 is only supported on GPUs with compute capability"),
        "bf16 was asked for on a GPU without bf16 support (compute capability below 8.0)",
        "use --precision fp16 (or fp32) on this GPU",
        "dalle-dist check --precision bf16",
        priority=340),
)
