"""What `dalle-dist doctor` knows: failure signatures of distributed DALL-E training, as data.

Each `Signature` names one recognisable failure (or one harmless warning) by the lines
the engines really print: PyTorch, torchrun, NCCL, DeepSpeed and its op builder and
launcher, Horovod, NVIDIA Apex, Triton, and dalle_dist's own `error: ...` lines.

Fields
    id        unique, short, kebab-case.
    category  one of CATEGORIES below (benign entries use BENIGN).
    patterns  Python regexes, each searched in one log line at a time (re.MULTILINE, so
              `^` and `$` are a line's ends; no pattern may span lines). Rank prefixes
              such as `[rank0]:`, `[1,0]<stderr>:` or DeepSpeed's `[<time>] [INFO] [...]`
              are stripped before matching. Named groups `(?P<name>...)` fill `{name}`
              placeholders in cause, fix and check.
    cause     what went wrong, in a sentence, for the user.
    fix       what to do about it.
    check     one shell command that shows whether the fix worked.
    benign    True for a harmless warning: it never decides the category of a log that
              also holds a failure; it is listed as a note. When a line matches several
              entries, the first of them here says whether the line is harmless.
    requires  regexes of which at least one must occur somewhere in the log for the
              entry to apply (context a single line cannot give, e.g. "fp16 was on", or
              which library's frames a removed-module ImportError passes through).
    scale_at_most
              makes the entry a sequence: every pattern captures the new loss scale in a
              group `scale`, and the entry applies only when the scale falls to this value
              or below somewhere in the log; it then decides on the first such line. A
              loss scaler's warm-up halves the scale a few times from 2**16 or 2**32 and
              settles; a scale halved step after step down to single digits means every
              step overflows (fp16 has diverged). The same lines above the floor stay the
              harmless warm-up notes.
    fallback  a catch-all (e.g. any NCCL error): it decides only when no specific entry
              matched, however telling its line; NCCL wraps other causes (a CUDA OOM, a
              duplicate GPU) in its own error line.

Patterns key on the stable part of a message (the engine's wording), never on versions,
paths, ranks or sizes; `doctor` removes timestamps, CI and logger prefixes, rank prefixes
and ANSI colours, and makes typographic punctuation plain (curly quotes, an en/em dash for
an option's `--`, no-break spaces), before matching: write patterns in ASCII.

Order matters: SIGNATURES lists root causes before the symptoms that usually follow
them (a rank's CUDA OOM before the other ranks' NCCL timeouts). `doctor.diagnose`
first prefers the most telling place in the log (torchrun's "Root Cause" section, then
exception and `error:` lines, then any line) and, among equally telling lines, the
entry listed first here.

Categories
    deepspeed-missing             DeepSpeed is not installed or not importable.
    deepspeed-op-build            a DeepSpeed C++/CUDA op (fused_adam, cpu_adam, ...) or
                                  its wheel failed to build or JIT-load.
    cuda-unavailable-or-mismatch  no usable GPU: CPU-only torch, no or old driver, a GPU
                                  this torch has no kernels for, fp16/bf16 not possible.
    cuda-oom                      a GPU ran out of memory.
    apex-missing-or-wrong         NVIDIA Apex absent, built without its extensions, or
                                  the unrelated PyPI `apex`; DeepSpeed's removed amp.
    horovod-not-built             Horovod absent, or built without torch / Gloo / MPI.
    nccl-comm                     ranks cannot talk: NCCL errors, collective timeouts,
                                  rendezvous store connections.
    sparse-attn-triton            DeepSpeed's sparse attention or Triton cannot load or run
                                  (missing, a version torch or DeepSpeed does not
                                  expect, torch.compile's inductor finding none); a
                                  library that only notes Triton is absent is benign.
    zero-checkpoint               a DeepSpeed ZeRO checkpoint that is incomplete or was
                                  saved by another number of ranks.
    fp16-overflow                 fp16 training diverged: the loss scale collapsed to its
                                  minimum, or the loss became NaN with fp16 on.
    launcher-args                 the launcher or the command line is wrong: unknown or
                                  missing arguments, no launcher environment, busy port.
    batch-size                    the batch does not fit the ranks / gradient accumulation,
                                  or the data holds fewer samples than one batch.
    other                         a known failure outside those: host RAM exhausted
                                  (SIGKILL), disk full, NaN loss without fp16, or any
                                  other `error: ... (fix)` line of dalle-dist.
Two further values are results, not entries: `benign` (BENIGN) when only harmless
warnings matched, and `unknown` (UNKNOWN) when nothing matched; doctor never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES: tuple[str, ...] = (
    "deepspeed-missing", "deepspeed-op-build", "cuda-unavailable-or-mismatch", "cuda-oom",
    "apex-missing-or-wrong", "horovod-not-built", "nccl-comm", "sparse-attn-triton",
    "zero-checkpoint", "fp16-overflow", "launcher-args", "batch-size", "other",
)
BENIGN = "benign"
UNKNOWN = "unknown"

# Context for entries that only mean fp16 trouble when fp16 was on.
_FP16_ON = (r"--precision[ =]fp16", r"--fp16\b", r"--amp\b", r"fp16_enabled\W+True",
            r'"fp16":\s*\{\s*"enabled":\s*true', r"Attempted loss scale",
            r"Gradient overflow\.", r"torch\.float16", r"opt_level",
            # mmcv/mmengine configs; torch's own AMP (GradScaler is for fp16 only)
            r"(?<![\w.])fp16\s*=\s*dict\(", r"Fp16OptimizerHook", r"AmpOptimWrapper",
            r"GradScaler\(", r"\bscaler\.scale\(",
            # CUDA autocast runs in fp16 unless given another dtype (its deprecation
            # warning names it too)
            r"cuda\.amp\.autocast\((?![^)]*bfloat16)",
            # a config, script or log file named for fp16 (mmdetection's
            # configs/fp16/*_fp16_*.py, a user's train_fp16.log)
            r"(?i)(?<![a-z0-9])fp16(?![a-z0-9])[\w./-]*\.(?:py|sh|ya?ml|json|txt|log|cfg)\b")

# "loss=nan" (tqdm), "loss - nan" (DALLE-pytorch), "loss: nan", '"loss": NaN' (JSON lines),
# "Loss is nan, stopping training" (DETR, and DeiT, MAE and the models built on them).
_NAN_LOSS = r"(?i)\bloss['\"]?(?:[ \t]*[:=-]?[ \t]*|[ \t]+is[ \t]+)nan\b"
_TORCH_ENV = ('python -c "import torch; print(torch.__version__, torch.version.cuda, '
              'torch.cuda.is_available(), torch.cuda.device_count())"')
# One all-reduce over NCCL, nothing of dalle_dist: does the wire work at all?
_NCCL_CHECK = ("NCCL_DEBUG=INFO torchrun --nproc_per_node 2 --no-python python -c \"import os, "
               "torch, torch.distributed as d; d.init_process_group('nccl'); "
               "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])); "
               "t = torch.ones(1, device='cuda'); d.all_reduce(t); print(t.item())\"")
# One all-reduce over Horovod's gloo controller, nothing of dalle_dist.
_HOROVOD_CHECK = ('horovodrun -np 2 --gloo python -c "import horovod.torch as hvd, torch; '
                  'hvd.init(); print(hvd.allreduce(torch.ones(1)))"')
# DeepSpeed's JIT-built ops, by the names its op builders give them (op_builder/*.py NAME):
# "Error building extension 'cpu_adam'" is DeepSpeed's even when the trimmed log never
# says DeepSpeed. Generic names (utils, transformer, quantizer) are left out: other
# projects build extensions named so.
_DS_OPS = ("async_io", "cpu_adagrad", "cpu_adam", "cpu_lion", "evoformer_attn",
           "fp_quantizer", "fused_adam", "fused_lamb", "fused_lion", "inference_core_ops",
           "ragged_device_ops", "ragged_ops", "random_ltd", "sparse_attn",
           "spatial_inference", "stochastic_transformer", "transformer_inference")
# Context that a C++/CUDA extension build in the log is DeepSpeed's: torch's extension
# builder, ninja and nvcc word every project's build alike (one entry per word, so each
# has a literal run for doctor's prefilter).
_DS_BUILD_CONTEXT = (r"(?i)deepspeed", r"op_builder", r"\bds_report\b",
                     *(rf"\b{op}\b" for op in _DS_OPS))
_DS_OPS_FIX = ("install the CUDA toolkit whose major.minor matches torch.version.cuda, "
               "with nvcc on PATH and CUDA_HOME set, plus ninja; or pip install a DeepSpeed "
               "release with prebuilt ops; or avoid the op (dalle_dist's default "
               "optimizer is torch's Adam, no fused op)")


@dataclass(frozen=True)
class Signature:
    """One recognisable failure (or harmless warning); see the module docstring."""

    id: str
    category: str
    patterns: tuple[str, ...]
    cause: str
    fix: str
    check: str
    benign: bool = False
    requires: tuple[str, ...] = ()
    scale_at_most: float | None = None
    fallback: bool = False


# A number as loss scalers print it: 65536, 65536.0, 0.5, 3.0517578125e-05.
_SCALE = r"(?P<scale>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
# The floor below which a dynamic loss scale means fp16 training has diverged.
SCALE_FLOOR = 8.0
# A logged loss-scale column decides only below 1: bf16 and fp32 runs of some frameworks
# (Megatron) print a static `loss scale: 1.0` every step; an exact 0 is the "dynamic"
# setting in DeepSpeed, Apex and transformers configs, never a value the scaler reached.
LOSS_SCALE_COLUMN_FLOOR = 0.5

SIGNATURES: tuple[Signature, ...] = (
    # -- fp16: a collapsed loss scale is the root cause of what follows ---------------------
    Signature(
        "ds-loss-scale-at-minimum", "fp16-overflow",
        (r"Current loss scale already at minimum",
         r"Minimum loss scale reached",
         r"\[deepspeed\] OVERFLOW! Rank \d+ Skipping step\. Attempted loss scale: [12], "
         r"reducing to 1\b"),
        "DeepSpeed's fp16 loss scale fell to its minimum: gradients overflow at every scale, "
        "so fp16 training has diverged (not the harmless early overflows)",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, add warmup, and resume from a checkpoint before the collapse",
        "grep -c 'OVERFLOW' LOGFILE"),
    # Sequences: the scale halved step after step down to single digits.
    Signature(
        "apex-loss-scale-collapse", "fp16-overflow",
        (r"Gradient overflow[.,]?\s+[Ss]kipping step,? loss scaler \d+ reducing loss "
         r"scale to " + _SCALE,),
        "Apex amp halved the loss scale overflow after overflow down to {scale}: gradients "
        "overflow at every scale, fp16 training has diverged",
        "train in bf16 (--precision bf16), or lower the learning rate and keep "
        "--clip_grad_norm; resume from a checkpoint before the collapse",
        "grep -c 'Gradient overflow' LOGFILE",
        scale_at_most=SCALE_FLOOR),
    Signature(
        "ds-loss-scale-collapse", "fp16-overflow",
        (r"(?:OVERFLOW!|[Oo]verflow detected\.|loss scale overflow!)[^\n]*Attempted loss "
         r"scale: [\d.e+-]+, reducing to " + _SCALE,
         r"Reducing dynamic loss scale from [\d.e+-]+ to " + _SCALE,
         r"[Ff]ound overflow[^\n]*(?:[Ll]oss scale|scale) (?:to|:) " + _SCALE,
         # fairseq (and its AMP optimizer); ColossalAI's dynamic grad scaler
         r"(?i)overflow detected, setting (?:loss )?scale to:? " + _SCALE,
         r"(?i)overflow occurs?, the loss scale is adjusted to " + _SCALE,
         # any scaler that says so in words: "decreased loss scale to 4", "reducing the
         # dynamic loss_scale to 0.5"
         r"(?i)\b(?:decreas|reduc|lower)(?:ed|ing) (?:the )?(?:dynamic )?loss[_ ]scale "
         r"(?:to|:) " + _SCALE),
        "the fp16 loss scale was halved overflow after overflow down to {scale}: "
        "gradients overflow at every scale, fp16 training has diverged (not the harmless "
        "warm-up overflows, which stop in the thousands)",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, add warmup, and resume from a checkpoint before the collapse",
        "grep -c -i 'overflow' LOGFILE",
        scale_at_most=SCALE_FLOOR),
    # guided-diffusion / improved-diffusion (and their forks) keep log2 of the scale: it
    # drops by 1 at each NaN; at 3 or below (a scale of 8 or less) every step overflows.
    Signature(
        "lg-loss-scale-collapse", "fp16-overflow",
        (r"(?i)\b(?:decreas|reduc|lower)(?:ed|ing) (?:the )?lg_loss_scale (?:to|:) "
         r"(?P<scale>-?\d+(?:\.\d+)?)",),
        "the fp16 loss scale (logged as its log2, lg_loss_scale) fell to 2**{scale}: every "
        "step finds NaN gradients and halves it again, fp16 training has diverged",
        "train in fp32 or bf16, or lower the learning rate; resume from a checkpoint before "
        "the collapse",
        "grep -c 'lg_loss_scale' LOGFILE",
        scale_at_most=3.0),
    Signature(
        "loss-scale-column-collapse", "fp16-overflow",
        (r"(?i)(?<![\w.-])loss[_ ]scale['\"]?[ \t]*[:=|]?[ \t]*(?!0*\.?0*(?![\d.eE]))"
         + _SCALE + r"(?![\w.])",),
        "the logged fp16 loss scale fell to {scale}: the dynamic scaler halved it at every "
        "overflow, so every step overflows and fp16 training has diverged (a static or "
        "healthy scale never drops below 1)",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, add warmup, and resume from a checkpoint before the collapse",
        "grep -n -i 'loss.scale' LOGFILE | tail",
        scale_at_most=LOSS_SCALE_COLUMN_FLOOR),
    Signature(
        "sampling-nan-probabilities", "fp16-overflow",
        (r"probability tensor contains either `?inf`?, `?nan`? or element < 0",
         r"invalid multinomial distribution \(sum of probabilities <= 0\)",
         r"sampleMultinomialOnce[^\n]*Assertion"),
        "sampling drew from NaN/inf probabilities: the logits overflowed, typically a "
        "model run (or trained) in fp16 beyond its range",
        "generate in bf16 or fp32 (--precision bf16), and check the checkpoint's loss was "
        "finite when it was saved",
        "dalle-dist generate --precision fp32 --text 'a test' --num_images 1"),
    # -- GPU memory -----------------------------------------------------------------------
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
        "nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv"),
    # -- CUDA missing or mismatched -------------------------------------------------------
    Signature(
        "torch-cpu-build", "cuda-unavailable-or-mismatch",
        (r"Torch not compiled with CUDA enabled",),
        "this torch is a CPU-only build, so CUDA cannot be used",
        "install a CUDA build of torch (pip install torch --index-url "
        "https://download.pytorch.org/whl/cu124, matching your driver), or run on CPU "
        "(--device cpu, --precision bf16)",
        _TORCH_ENV),
    Signature(
        "nvidia-driver-missing", "cuda-unavailable-or-mismatch",
        (r"Found no NVIDIA driver on your system",
         r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
        "no NVIDIA driver is loaded on this machine (or in this container)",
        "install the NVIDIA driver; in Docker run with --gpus all and the NVIDIA container "
        "toolkit",
        "nvidia-smi"),
    Signature(
        "nvidia-driver-too-old", "cuda-unavailable-or-mismatch",
        (r"NVIDIA driver on your system is too old \(found version (?P<found>\d+)\)",
         r"CUDA driver version is insufficient for CUDA runtime version"),
        "the NVIDIA driver is older than the CUDA runtime this torch was built with",
        "update the driver, or install a torch built for an older CUDA "
        "(https://pytorch.org/get-started/locally/)",
        "nvidia-smi  # 'CUDA Version' must be >= torch.version.cuda"),
    Signature(
        "gpu-arch-unsupported", "cuda-unavailable-or-mismatch",
        (r"no kernel image is available for execution on the device",
         r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation",
         r"PyTorch no longer supports this GPU because it is too old"),
        "this torch build has no kernels for this GPU's architecture (compute capability)",
        "install a torch wheel built for this GPU (a newer CUDA build for new GPUs); for "
        "DeepSpeed ops rebuild them with TORCH_CUDA_ARCH_LIST set to this GPU's capability",
        'python -c "import torch; print(torch.cuda.get_arch_list(), '
        'torch.cuda.get_device_capability())"'),
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
        "dalle-dist check --cuda-smoke"),
    Signature(
        "cuda-is-available-false", "cuda-unavailable-or-mismatch",
        (r"^\s*(?:>>> )?(?:returns? |returned |-> ?)?False\s*$",),
        "torch.cuda.is_available() printed False: torch sees no GPU (a CPU-only build, no "
        "driver, or a driver older than the torch wheel's CUDA)",
        "compare nvidia-smi's CUDA version with torch.version.cuda and install the matching "
        "torch wheel (or update the driver); in containers pass --gpus all",
        _TORCH_ENV,
        requires=(r"torch\.cuda\.is_available\(\)",)),
    Signature(
        "libcudart-missing", "cuda-unavailable-or-mismatch",
        (r"lib(?:cudart|cublas|cudnn)\S*\.so[.\d]*: cannot open shared object file",),
        "a CUDA runtime library that torch or an engine was built against is missing",
        "install the matching CUDA runtime (or a torch wheel that bundles it) and rebuild "
        "the engine against the installed torch",
        _TORCH_ENV),
    Signature(
        "fp16-without-gpu", "cuda-unavailable-or-mismatch",
        (r"DeepSpeed cannot train fp16 on CPU",
         r"Type fp16 is not supported on your device",
         # Composer's "Precision.AMP_BF16 is not supported for CPU training", and alike
         r"(?i)(?:fp16|bf16|amp|half)\w*(?: mixed)?(?: precision)? is not supported "
         r"(?:for|on) (?:the )?CPU\b"),
        "fp16 (or GPU mixed precision) was asked for but the run is on CPU (no usable GPU)",
        "use --precision bf16 on CPU; if a GPU was expected, find out why torch sees none",
        "dalle-dist check --backend deepspeed --precision fp16"),
    Signature(
        "bf16-unsupported", "cuda-unavailable-or-mismatch",
        (r"this GPU has no bf16", r"Type bf16 is not supported on your device",
         # transformers' TrainingArguments ("Your setup doesn't support bf16/gpu"), vLLM,
         # torch.cuda.is_bf16_supported() checks in training scripts
         r"(?i)\b(?:does ?n[o']t|does not|not) support (?:bf16|bfloat16)\b",
         r"(?i)\bbfloat16 is only supported on GPUs with compute capability"),
        "bf16 was asked for on a GPU without bf16 support (compute capability below 8.0)",
        "use --precision fp16 (or fp32) on this GPU",
        "dalle-dist check --precision bf16"),
    # -- DeepSpeed sparse attention and Triton ---------------------------------------------
    # A library that only uses Triton when it is there (xformers) says so and carries on;
    # listed first, it claims the ImportError it quotes.
    Signature(
        "triton-optional-missing", BENIGN,
        (r"A matching Triton is not available",
         r"No module named '?triton'?(?![.\w])"),
        "a library (xformers) found no usable Triton and runs without its Triton kernels: "
        "slower paths, nothing fails",
        "nothing; install the Triton matching torch only for those optimisations",
        'python -c "import triton; print(triton.__version__)"',
        benign=True,
        requires=(r"A matching Triton is not available",)),
    Signature(
        "triton-optional-notice", BENIGN,
        (r"(?i)\btriton is not (?:available|installed)\b[^\n]*\b(?:some optimi[sz]ations|"
         r"will not be (?:enabled|used)|fall(?:ing)? ?back|disabled)",
         r"(?i)just a warning:? triton is not (?:available|installed)"),
        "a library found no Triton and runs without its Triton kernels: slower at most, "
        "nothing fails",
        "nothing; install the Triton matching torch only for those optimisations",
        'python -c "import triton; print(triton.__version__)"',
        benign=True),
    Signature(
        "triton-unusable", "sparse-attn-triton",
        (r"Cannot find a working triton installation",
         r"cannot import name '?\w+'? from '?triton(?:\.\w+)*(?:'|\s|$)",
         r"No module named '?triton[.\s]+\w",
         r"(?:DLL load failed while importing|ImportError: [^\n]*)\blibtriton",
         r"too old to be supported by the triton GPU compiler"),
        "Triton (the compiler behind torch.compile's inductor backend and DeepSpeed's sparse "
        "attention) is missing, of another version than torch expects, or cannot run on "
        "this GPU",
        "install the Triton release that matches this torch (pip install -U torch triton; "
        "on Windows the triton-windows wheel for this torch), or run without torch.compile "
        "(eager) and without DeepSpeed's sparse attention",
        'python -c "import torch, triton; print(torch.__version__, triton.__version__)"'),
    Signature(
        "triton-missing", "sparse-attn-triton",
        (r"No module named '?triton'?(?![.\w])",),
        "Triton is not installed, and DeepSpeed's sparse attention kernels need it",
        "drop DeepSpeed's kernel: dalle_dist's --attn_types sparse runs as a block mask "
        "(SDPA on CPU, FlexAttention on CUDA) and needs no Triton; otherwise install the "
        "Triton version your DeepSpeed release pins",
        'python -c "import triton; print(triton.__version__)"'),
    Signature(
        "triton-api-mismatch", "sparse-attn-triton",
        (r"module 'triton' has no attribute '?(?P<name>\w+)'?",
         r"dlsym unable to load function",
         r"IndexError: map::at",
         r"using untested triton version"),
        "the installed Triton does not match the version DeepSpeed's sparse attention was "
        "written for",
        "use dalle_dist's own sparse pattern (no Triton needed), or pin the Triton version "
        "your DeepSpeed release lists in requirements-sparse_attn.txt",
        'python -c "import triton; print(triton.__version__)"'),
    Signature(
        "ds-sparse-attention-unavailable", "sparse-attn-triton",
        (r"No module named '?deepspeed\.ops\.sparse_attention",
         r"cannot import name '?\w*Spars\w*'? from '?deepspeed",
         r"sparse_attn requires (?:a torch version|CUDA version)",
         r"Unable to JIT load the sparse_attn op",
         r"Unable to pre-compile sparse_attn",
         r"please install triton==[\d.]+ if you want to use sparse attention",
         r"[/\\]deepspeed[/\\]ops[/\\]sparse_attention[/\\]\w+\.py"),
        "DeepSpeed's sparse attention is not available here (removed from recent DeepSpeed "
        "releases; older ones need torch < 2, CUDA 10.1-11 and an exact Triton)",
        "use --attn_types with dalle_dist's mask-based sparse pattern, which needs no "
        "DeepSpeed kernel",
        "ds_report | grep -i sparse"),
    Signature(
        "ds-sparse-attention-fp16-only", "sparse-attn-triton",
        (r"(?i)sparse attention only supports (?:training in )?fp16",),
        "DeepSpeed's sparse attention (its Triton kernels) runs in fp16 only, and this run "
        "gave it fp32 tensors (often at sampling or evaluation time, outside the fp16 "
        "engine); older DeepSpeed and Triton releases are needed for it at all",
        "run the model in fp16 where it uses DeepSpeed's sparse attention, or use "
        "dalle_dist's mask-based sparse pattern (--attn_types), which needs no DeepSpeed "
        "kernel and runs in any precision",
        "ds_report | grep -i sparse"),
    # -- DeepSpeed ops --------------------------------------------------------------------
    Signature(
        "ds-cuda-home-missing", "deepspeed-op-build",
        (r"CUDA_HOME does not exist, unable to compile CUDA op",
         r"MissingCUDAException"),
        "DeepSpeed tried to compile a CUDA op but finds no CUDA toolkit (CUDA_HOME unset, "
        "no nvcc)",
        "install the CUDA toolkit matching torch.version.cuda and export CUDA_HOME, or use "
        "a DeepSpeed wheel with prebuilt ops, or avoid the op",
        "echo $CUDA_HOME; nvcc --version; ds_report"),
    Signature(
        "ds-cuda-toolkit-mismatch", "deepspeed-op-build",
        (r">- DeepSpeed Op Builder: Installed CUDA version [\d.]+ does not match",
         r"unable to compile cuda/cpp extensions without a matching cuda version",
         r"CUDAMismatchException"),
        "the CUDA toolkit (nvcc) differs in major version from the CUDA torch was built "
        "with, so DeepSpeed refuses to compile its ops",
        "install the toolkit matching torch.version.cuda (or a torch matching the "
        "toolkit) and point CUDA_HOME at it",
        'nvcc --version; python -c "import torch; print(torch.version.cuda)"'),
    # torch's own check when any C++/CUDA extension builds; a DeepSpeed op when DeepSpeed
    # is in the log (Apex's build says it in its own words, apex-build-cuda-mismatch).
    Signature(
        "torch-ext-cuda-mismatch", "deepspeed-op-build",
        (r"The detected CUDA version \([\d.]+\) mismatches the version that was used to "
         r"compile PyTorch",),
        "the CUDA toolkit (nvcc) that builds DeepSpeed's op differs from the CUDA torch was "
        "built with, and torch's extension builder refuses it",
        "install the toolkit matching torch.version.cuda (or a torch matching the toolkit) "
        "and point CUDA_HOME at it; or use a DeepSpeed wheel with prebuilt ops",
        'nvcc --version; python -c "import torch; print(torch.version.cuda)"',
        requires=_DS_BUILD_CONTEXT),
    Signature(
        "ds-ninja-missing", "deepspeed-op-build",
        (r"Unable to JIT load the (?P<op>\w+) op due to ninja not being installed",
         r"Ninja is required to load C\+\+ extensions"),
        "DeepSpeed builds its ops just in time with ninja, which is not installed",
        "pip install ninja (and make sure `ninja --version` runs in the job's environment)",
        "ninja --version; ds_report"),
    Signature(
        "ds-op-build-failed", "deepspeed-op-build",
        (r"Error building extension '(?P<op>\w+)'",
         r"Unable to JIT load the (?P<op>\w+) op due to it not being compatible",
         r"Unable to pre-compile (?P<op>\w+)",
         r"Failed building wheel for deepspeed",
         r"'DeepSpeedCPUAdam' object has no attribute 'ds_opt_adam'",
         r"ninja: build stopped: subcommand failed",
         r"nvcc fatal\s*:\s*Unsupported gpu architecture '?compute_\d+",
         r"^FAILED: [^\n]*\.o\s*$",   # ninja: an object file failed to compile
         r"Command '\['ninja', '-v'\]' returned non-zero exit status",
         r"Error compiling objects for extension",
         r"\bin _run_ninja_build\b",
         r"torch_extensions[/\\][^\n]*\.so: (?:cannot open shared object file|undefined "
         r"symbol)",   # a JIT build missing, or cached from another torch
         r"[/\\]deepspeed[/\\][\w/\\.-]*\.so: undefined symbol"),   # prebuilt ops
        "a DeepSpeed C++/CUDA op failed to compile (see the compiler errors above it)",
        _DS_OPS_FIX,
        "ds_report",
        # torch's extension builder, ninja and nvcc word every project's build alike: a
        # build is DeepSpeed's only when the log names DeepSpeed or one of its ops.
        requires=_DS_BUILD_CONTEXT),
    # -- DeepSpeed not there ----------------------------------------------------------------
    Signature(
        "deepspeed-not-installed", "deepspeed-missing",
        (r"No module named '?deepspeed'?(?![.\w])",
         r"No module named '?deepspeed\.[\w.]+'?",
         r"NameError: name '?deepspeed'? is not defined",   # its import was in try/except
         r"(?:deepspeed|ds_report): (?:command )?not found",
         r"command not found: (?:deepspeed|ds_report)",
         r"'deepspeed' is not recognized as an internal or external command",
         r"backend deepspeed (?:is not installed|cannot run here)",
         r"holds ZeRO partitions and DeepSpeed does not import",
         r"requires the DeepSpeed library but it was not found",
         r"(?i)\bDeepSpeed is not (?:installed|available)\b",
         r"(?i)must have [`'\"]?deepspeed[`'\"]? installed",
         r"(?i)\brequires? [`'\"]?deepspeed[`'\"]?(?:[.,;:]|\s*$|\s+(?:to be |but |-|\())",
         r"requires `?deepspeed`? to be installed"),
        "DeepSpeed is not installed (or not importable) in the environment that ran",
        "pip install 'dalle_dist[deepspeed]' in the same environment the launcher uses "
        "(and put that environment's bin/ on PATH for the deepspeed launcher)",
        "dalle-dist check --backend deepspeed"),
    Signature(
        "deepspeed-version-pin", "deepspeed-missing",
        (r"\bdeepspeed\s*[<>=!~]=?\s*[\d.]+[^\n]*\bis required\b",
         r"\bdeepspeed[<>=!~]=?[\d.]+[^\n]*\bbut found deepspeed",
         r"(?i)requires? deepspeed\s*[<>=!~]=?\s*[\d.]+"),
        "the installed DeepSpeed is outside the version range this code requires",
        "install a DeepSpeed release in the required range (pip install 'deepspeed<x,>=y' as "
        "the error line says), or use dalle_dist's own backends",
        'python -c "import deepspeed; print(deepspeed.__version__)"'),
    Signature(
        "deepspeed-torch-too-new", "deepspeed-missing",
        (r"No module named '?torch\._six'?",
         r"cannot import name '\w+' from 'torch\._six'"),
        "this DeepSpeed release imports torch._six, which torch 2.0 removed: DeepSpeed is "
        "too old for the installed torch and cannot be imported",
        "upgrade DeepSpeed (pip install -U deepspeed) or pin torch below 2.0",
        'python -c "import deepspeed, torch; print(deepspeed.__version__, torch.__version__)"',
        requires=(r"[/\\]deepspeed[/\\][\w/\\]+\.py",)),
    Signature(
        "deepspeed-install-failed", "deepspeed-missing",
        (r"(?:Preparing metadata \(setup\.py\)|Getting requirements to build wheel)"
         r"[ .]*\berror\b",
         r"Unable to import torch, pre-compiling ops will be disabled",
         r"Unable to pre-compile ops without torch installed"),
        "installing DeepSpeed failed before any op was built (its setup needs torch "
        "importable in the same environment), so DeepSpeed is not installed",
        "install torch first, then pip install deepspeed in that environment "
        "(--no-build-isolation when building from source)",
        'python -c "import torch, deepspeed"',
        requires=(r"(?i)(?:Collecting|Downloading|Using cached)\s+\S*deepspeed",)),
    # -- Horovod ------------------------------------------------------------------------
    Signature(
        "horovod-torch-extension", "horovod-not-built",
        (r"Extension horovod\.torch has not been built",
         r"Horovod has not been built with PyTorch support",
         r"backend horovod cannot run here",
         r"module 'horovod\.torch' has no attribute '(?:init|allreduce|size|rank)'",
         r"'NoneType' object has no attribute '(?:init|allreduce|broadcast_parameters|"
         r"broadcast_optimizer_state|DistributedOptimizer|local_rank|size)'",
         # its extension built against another torch than the one importing it
         r"[/\\]horovod[/\\][\w/\\.-]*\.so[.\d]*: undefined symbol"),
        "Horovod is installed without its PyTorch extension (it failed to build, or was "
        "built before this torch)",
        "rebuild it: scripts/build_horovod.sh (HOROVOD_WITH_PYTORCH=1, C++17 against current "
        "torch, --no-build-isolation), then pip install 'dalle_dist[horovod]'",
        "horovodrun --check-build"),
    Signature(
        "horovod-transport-missing", "horovod-not-built",
        (r"(?P<wire>Gloo|MPI) support (?:is required to use elastic training, but )?"
         r"has not been built",
         r"Horovod has not been built with MPI support",
         r"Horovod was built without Gloo and without MPI",
         r"Failed to determine if (?P<wire2>Gloo|MPI) support has been built"),
        "Horovod was built without the transport the launch needs (Gloo or MPI)",
        "rebuild with HOROVOD_WITH_GLOO=1 (scripts/build_horovod.sh), or launch with the "
        "transport it has (horovodrun --gloo / --mpi)",
        "horovodrun --check-build"),
    Signature(
        "horovod-build-failed", "horovod-not-built",
        (r"Failed (?:building wheel for|to build) horovod",
         r"(?:Running setup\.py install|Building wheel) for horovod\b[^\n]*\.\.\. error",
         r"C\+\+17 or later compatible compiler is required",
         r"-- Configuring incomplete, errors occurred!",
         r"CMake Error",
         r"CalledProcessError: Command '\['cmake'",
         r"[/\\]horovod[/\\]setup\.py\", line \d+, in build_extensions"),
        "building Horovod failed; Horovod 0.28.1's CMake asks for C++14 while torch >= 2.1 "
        "headers need C++17",
        "build with scripts/build_horovod.sh (sets CMAKE_CXX_STANDARD 17, "
        "--no-build-isolation) and keep the wheel",
        "horovodrun --check-build",
        requires=(r"(?i)horovod",)),
    Signature(
        "horovod-not-installed", "horovod-not-built",
        (r"No module named '?horovod",
         r"horovodrun: (?:command )?not found",
         r"command not found: horovodrun",
         r"`?horovod`? (?:is not installed|to be installed)",
         r"\bhorovod\s*[<>=!~]=?\s*[\d.]+[^\n]*\bis required\b"),
        "Horovod is not installed in the environment that ran",
        "build and install it: scripts/build_horovod.sh, then pip install "
        "'dalle_dist[horovod]'",
        "horovodrun --check-build"),
    # -- Apex ---------------------------------------------------------------------------
    # Apex's fallback warning quotes the ImportError of amp_C: listed first, it claims the line.
    # Its other fallback notices (flatten/unflatten, SyncBatchNorm) name the missing build
    # option too, which apex-extensions-missing reads as a failure elsewhere.
    Signature(
        "apex-python-fallback", BENIGN,
        (r"multi_tensor_applier fused unscale kernel is unavailable",
         r"Falling back to Python flatten and unflatten",
         r"using Python fallback for SyncBatchNorm",
         r"Python fallbacks will be used instead"),
        "Apex was installed without --cuda_ext --cpp_ext and runs that part in Python: "
        "slower, still correct",
        "nothing; rebuild Apex with its extensions only for speed",
        'python -c "import amp_C"',
        benign=True),
    # Libraries that use Apex only when it is there say it is missing and carry on
    # (Megatron's "Apex is not installed. Falling back to Torch LayerNorm"); listed before
    # apex-not-installed, this claims such a line.
    Signature(
        "apex-optional-missing", BENIGN,
        (r"(?i)\bapex (?:is not|isn't|was not|not) (?:installed|available|found)\b[^\n]*"
         r"\b(?:fall(?:ing)? ?back|defaulting to|trying to continue|continuing|using "
         r"(?:torch|pytorch|native)|instead)\b",
         r"(?i)\bcould not import (?:nvidia )?apex\b[^\n]*"
         r"\b(?:fall(?:ing)? ?back|defaulting to|trying to continue|continuing|using "
         r"(?:torch|pytorch|native)|instead)\b"),
        "a library found no NVIDIA Apex and uses its own or torch's kernels instead: "
        "slower at most, nothing fails",
        "nothing; install Apex only for those kernels",
        'python -c "import apex"',
        benign=True),
    Signature(
        "dalle-dist-amp-fallback", BENIGN,
        (r"--amp: (?:NVIDIA Apex with apex\.amp is not importable|Apex amp needs CUDA)",),
        "dalle-dist used torch.autocast fp16 with a gradient scaler because Apex amp is not "
        "usable here: same training, no Apex",
        "nothing; pass --precision fp16 instead of --amp to skip the message",
        'python -c "from apex import amp"',
        benign=True),
    Signature(
        "deepspeed-amp-removed", "apex-missing-or-wrong",
        (r"NVIDIA Apex AMP integration has been removed",
         r"--deepspeed_config has an 'amp' block"),
        "the DeepSpeed config has an 'amp' block (Apex amp), which DeepSpeed no longer "
        "accepts",
        "remove the 'amp' block and use --precision bf16 (or fp16) instead",
        "grep -n '\"amp\"' YOUR_DS_CONFIG.json"),
    Signature(
        "apex-pypi-impostor", "apex-missing-or-wrong",
        (r"UnencryptedCookieSessionFactoryConfig",
         r"from pyramid\.session import",
         r"[/\\]apex[/\\]interfaces\.py",
         r"Class advice impossible in Python3"),
        "the `apex` that imports is the unrelated PyPI package (a pyramid web helper), not "
        "NVIDIA Apex",
        "pip uninstall apex; use native mixed precision (--precision fp16 or bf16), or build "
        "NVIDIA Apex from github.com/NVIDIA/apex",
        'python -c "import apex, sys; print(apex.__file__)"'),
    Signature(
        "apex-torch-too-new", "apex-missing-or-wrong",
        (r"No module named '?torch\._six'?",
         r"cannot import name '\w+' from 'torch\._six'"),
        "this Apex build imports torch._six, which torch 2.0 removed: Apex is too old for "
        "the installed torch",
        "rebuild NVIDIA Apex from a current checkout, or use native mixed precision "
        "(--precision fp16 or bf16)",
        'python -c "import apex"',
        requires=(r"[/\\]apex[/\\][\w/\\]+\.py",)),
    # transformers imports DeepSpeed (its integration) inside a lazy import and reports only
    # "Failed to import transformers...: No module named 'torch._six'"; its own code never
    # imported torch._six. After apex-torch-too-new, which wins when Apex frames show.
    Signature(
        "deepspeed-torch-too-new-wrapped", "deepspeed-missing",
        (r"No module named '?torch\._six'?",
         r"cannot import name '\w+' from 'torch\._six'"),
        "an import that transformers wraps failed on torch._six, which torch 2.0 removed; "
        "the module importing it is DeepSpeed (older than 0.8.1), pulled in by transformers' "
        "DeepSpeed integration: DeepSpeed is too old for the installed torch",
        "upgrade DeepSpeed (pip install -U deepspeed), or uninstall it if the run does not "
        "use it, or pin torch below 2.0",
        'python -c "import deepspeed, torch; print(deepspeed.__version__, torch.__version__)"',
        requires=(r"Failed to import transformers\.",)),
    Signature(
        "apex-amp-missing", "apex-missing-or-wrong",
        (r"cannot import name '?amp'? from '?apex",
         r"module 'apex' has no attribute '?amp",
         r"No module named '?apex\.amp",
         r"cannot import name '?\w+'? from '?apex(?:\.\w+)*'?"),
        "the `apex` that imports lacks what the code imports from it (`amp`, or another "
        "name): either the unrelated PyPI package named apex, or an NVIDIA Apex of another "
        "vintage (amp was removed upstream)",
        "pip uninstall apex; use native mixed precision (--precision fp16 or bf16) instead "
        "of Apex amp",
        'python -c "import apex, sys; print(apex.__file__, hasattr(apex, \'amp\'))"'),
    # Code that imports Apex amp inside try/except (or sets it to None) fails only where it
    # uses amp: a NameError or a None without amp's functions. Only Apex amp has
    # initialize/scale_loss/master_params (torch.cuda.amp has none), so those calls, or an
    # Apex import, in the log say which `amp` is meant.
    Signature(
        "apex-amp-not-imported", "apex-missing-or-wrong",
        (r"NameError: name '?amp'? is not defined",
         r"'NoneType' object has no attribute '(?:initialize|scale_loss|master_params)'"),
        "the code uses Apex amp (amp.initialize, amp.scale_loss) but its import of Apex "
        "failed quietly: NVIDIA Apex is not installed (or not importable) here",
        "use native mixed precision (--precision fp16 or bf16), which needs no Apex; or "
        "build NVIDIA Apex from github.com/NVIDIA/apex",
        'python -c "from apex import amp"',
        requires=(r"\bamp\.(?:initialize|scale_loss|master_params)\(",
                  r"\bfrom apex import\b", r"^\s*import apex\b")),
    Signature(
        "apex-build-cuda-mismatch", "apex-missing-or-wrong",
        (r"Cuda extensions are being compiled with a version of Cuda that does not match the "
         r"version used to compile Pytorch binaries",),
        "NVIDIA Apex's extensions did not build: the CUDA toolkit (nvcc) differs from the "
        "CUDA torch was built with, so Apex is missing or lacks its extensions",
        "use native mixed precision (--precision fp16 or bf16), which needs no Apex; or "
        "install the toolkit matching torch.version.cuda and rebuild Apex",
        'nvcc --version; python -c "import torch; print(torch.version.cuda)"'),
    Signature(
        "apex-extensions-missing", "apex-missing-or-wrong",
        (r"No module named '?(?P<ext>amp_C|apex_C|fused_layer_norm_cuda|fused_adam_cuda|"
         r"syncbn|fused_dense_cuda|fused_mix_prec_layer_norm_cuda|mlp_cuda|"
         r"scaled_upper_triang_masked_softmax_cuda|scaled_masked_softmax_cuda)'?",
         # Apex's optimizers refuse to run without them, MultiTensorApply and old releases
         # name the missing build option, its contrib modules the missing build flag
         # (fallback notices naming them are benign, above)
         r"\bapex\.[\w.]+ requires cuda extensions",
         r"\bFP16_Optimizer requires cuda extensions",   # apex.contrib's
         r"(?i)\bapex was installed without --(?:cpp|cuda)_ext",
         r"\bapex was installed without --\w+ flag"),
        "NVIDIA Apex was installed without its C++/CUDA extensions, which this code path needs",
        "reinstall Apex from source with its extensions (pip install -v "
        "--no-build-isolation --config-settings '--build-option=--cpp_ext' "
        "--config-settings '--build-option=--cuda_ext' ./apex), or use native precision",
        'python -c "import amp_C, fused_layer_norm_cuda"'),
    Signature(
        "apex-extension-stale", "apex-missing-or-wrong",
        (r"(?:amp_C|apex_C|fused_layer_norm_cuda|fused_adam_cuda|syncbn|fused_dense_cuda|"
         r"fused_mix_prec_layer_norm_cuda|mlp_cuda|fused_weight_gradient_mlp_cuda|"
         r"scaled_upper_triang_masked_softmax_cuda|scaled_masked_softmax_cuda)"
         r"[\w.-]*\.so: undefined symbol",
         r"[/\\]apex[/\\][\w/\\.-]*\.so: undefined symbol"),
        "NVIDIA Apex's C++/CUDA extensions were built against another torch than the one "
        "importing them (undefined symbol): Apex must be rebuilt for this torch",
        "rebuild Apex from source against the installed torch (pip install -v "
        "--no-build-isolation ... ./apex after upgrading torch), or use native precision "
        "(--precision fp16 or bf16), which needs no Apex",
        'python -c "import torch, amp_C; print(torch.__version__)"'),
    Signature(
        "apex-not-installed", "apex-missing-or-wrong",
        (r"No module named '?apex'?(?![.\w])",
         r"NameError: name '?apex'? is not defined",   # its import was in try/except
         r"No module named apex\.\w",   # Python 2 names the whole dotted path, unquoted
         r"(?i)\bcould not import (?:nvidia )?apex\b",   # allennlp
         r"(?i)please install apex from https?://(?:www\.)?github\.com/nvidia/apex",
         # timm, transformers' old Trainer, NeMo: "... but APEX is not installed",
         # "Apex was not found. Please see ..." (apex-optional-missing claims notices)
         r"(?i)\b(?:nvidia )?apex (?:is not|isn't|was not|not) (?:installed|available|found)\b"),
        "NVIDIA Apex is not installed (it is not on PyPI)",
        "use native mixed precision (--precision fp16 or bf16); Apex is optional",
        'python -c "import apex"'),
    # -- ZeRO checkpoints ---------------------------------------------------------------
    Signature(
        "zero-world-size-changed", "zero-checkpoint",
        (r"The checkpoint being loaded used a DP world size of (?P<saved>\d+) but the "
         r"current world size is (?P<now>\d+)",
         r"holds ZeRO-\d partitions of (?P<saved>\d+) ranks, this run has (?P<now>\d+)"),
        "the ZeRO checkpoint was saved by {saved} ranks and this run has {now}: ZeRO's "
        "optimizer partitions cannot be re-split on load",
        "resume with {saved} ranks, or consolidate it first: "
        "dalle-dist checkpoint convert NAME-ds-cp/ NAME.pt (weights only, fresh optimizer)",
        "ls NAME-ds-cp/$(cat NAME-ds-cp/latest) | grep -c optim_states"),
    Signature(
        "zero3-placeholder-weights", "zero-checkpoint",
        (r"copying a param with shape torch\.Size\(\[[01]?\]\) from checkpoint",
         r"^\s*[\w.]+\.(?:weight|bias)\b['\"]?\s*[:=,]?\s*(?:shape\s*[:=]?\s*)?"
         r"torch\.Size\(\[0\]\)",
         # accelerate loading such a checkpoint into an empty model
         r"Trying to set a tensor of shape torch\.Size\(\[0\]\) in "),
        "the checkpoint holds ZeRO-3 placeholders (empty or 1-element tensors) instead of "
        "weights: it was saved from a ZeRO-3 partitioned model without gathering the "
        "parameters",
        "consolidate the weights first (zero_to_fp32.py in the checkpoint folder, or "
        "dalle-dist checkpoint convert NAME-ds-cp/ NAME.pt), or save with "
        "stage3_gather_16bit_weights_on_model_save",
        "ls NAME-ds-cp/*/ | grep -c optim_states"),
    Signature(
        "zero-partition-missing", "zero-checkpoint",
        (r"(?:No such file or directory|not found|FileNotFoundError).*_(?:optim|model)"
         r"_states\.pt",
         r"Expected \d+ of '\*_optim_states\.pt' under .* but found \d+ files",
         r"can't find model states file at",
         r"Unable to find latest file at",
         r"has no 'latest' file: no save of it finished",
         r"'latest' names .*, which is missing",
         r"DeepSpeed could not load \S+",
         r"Invalid for universal checkpoint",
         r"\bin check_ckpt_list\b",
         r"zero_to_fp32[^\n]*(?:FileNotFoundError|No such file)",
         # DeepSpeed's checkpoint readers (conversion to Megatron or universal, zero_to_fp32)
         r"No ZeRO files found in",
         r"can't find [^\n]*(?:ZeRO|_states)[^\n]* files in directory",
         r"Missing ZeRO(?:-\d)? (?:optimizer )?checkpoint",
         r"ZeRO-\d checkpoint has no model/optimizer rank files"),
        "the DeepSpeed checkpoint directory is incomplete: a rank's partition file, the "
        "tag or 'latest' is missing (a save that did not finish, or files not copied from "
        "every node)",
        "resume from an earlier complete tag (write its name into NAME-ds-cp/latest), or copy "
        "the missing zero_pp_rank_* files from the node that wrote them",
        "cat NAME-ds-cp/latest; ls NAME-ds-cp/*/"),
    # -- batch size ---------------------------------------------------------------------
    Signature(
        "batch-not-divisible", "batch-size",
        (r"Check batch related parameters\.",
         r"train_batch_size is not\s+equal to micro_batch_per_gpu \* gradient_acc_step",
         r"is the global batch of backend \w+ and must be a multiple of the \d+ ranks"
         r"(?: \((?P<hint>use --batch_size [^)]*)\))?",
         r"is the (?:global|per-worker) batch of backend \w+ and must be a multiple of "
         r"--ga_steps \d+(?: x \d+ ranks)?(?: \(\d+\))?(?: \((?P<hint2>use --batch_size [^)]*)\))?",
         r"\(DeepSpeed's train_batch_size\) is not divisible by --ga_steps",
         r"train_batch_size \d+ != micro batch \d+ x --ga_steps",
         r"--deepspeed_config (?:.+ )?sets (?:train_batch_size|gradient_accumulation_steps) \d+ "
         r"but --(?:batch_size|ga_steps) is \d+",
         r"(?:Train batch size|Micro batch size per gpu|Gradient accumulation steps): -?\d+ "
         r"has to be greater than 0",
         r"(?i)\bbatch[ _]?size\b[^\n]*\b(?:is not|must be) (?:a multiple of|divisible by)",
         # (each with a literal run, so the prefilter skips lines without it)
         r"(?i)\bis not (?:a multiple of|divisible by)\b[^\n]*"
         r"\b(?:micro[ _-]?batch|batch[ _]?size)",
         r"(?i)\bmust be (?:a multiple of|divisible by)\b[^\n]*"
         r"\b(?:micro[ _-]?batch|batch[ _]?size)",
         # a script's own check: assert args.batch_size % len(devices) == 0
         r"(?i)\bassert\b[^\n]*batch[_ ]?size\w*\s*%[^\n]*\b(?:devices|gpus?|n_?gpus?|"
         r"num_gpus|world_size|ranks|nprocs)\b[^\n]*==\s*0",
         # verl's DataProto split over workers
         r"only support equal chunk\. Got size of DataProto"),
        "the batch size does not split over ranks and gradient accumulation steps "
        "(global batch = micro batch x --ga_steps x ranks)",
        "pick a --batch_size that is a multiple of --ga_steps x ranks (the error line names "
        "one), and drop train_batch_size / train_micro_batch_size_per_gpu from "
        "--deepspeed_config or make them agree",
        "grep -n batch_size YOUR_DS_CONFIG.json"),
    Signature(
        "batch-larger-than-data", "batch-size",
        (r"too few for a batch of \d+ on each of \d+ ranks",
         r"WebDataset shards hold fewer than a batch",
         r"num_samples should be a positive integer value, but got num_samples=0",
         # torch's BatchSampler given a per-rank batch that rounded down to 0
         r"batch_size should be a positive integer value, but got batch_size=0",
         r"assert len\(indices\) == self\.(?:total_size|num_samples)",
         r"This DataLoader does not contain any batches"),
        "the dataset (or a rank's share of it) holds fewer samples than one batch",
        "lower --batch_size, use fewer ranks, or add data / shards",
        "ls DATASET | wc -l"),
    # -- NaN loss with fp16 on --------------------------------------------------------------
    Signature(
        "fp16-nan-loss", "fp16-overflow",
        (_NAN_LOSS,
         r"returned nan values in its \d+th output",
         r"Loss became infinite or NaN"),   # detectron2's trainer
        "the loss became NaN with fp16 on: activations or gradients overflowed fp16's range",
        "train in bf16 (--precision bf16) if the GPU has it; else lower the learning rate, "
        "keep --clip_grad_norm, and resume from a checkpoint saved before the NaN",
        "grep -in 'nan' LOGFILE | head",
        requires=_FP16_ON),
    # -- launcher and command line --------------------------------------------------------
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
        "dalle-dist --local_rank=0 train --help"),
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
        "dalle-dist train --help"),
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
        "env | grep -E '^(RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)='"),
    Signature(
        "port-in-use", "launcher-args",
        (r"(?i)address already in use", r"EADDRINUSE", r"errno: 98\b"),
        "the rendezvous port (MASTER_PORT, 29500 by default) is taken, often by a previous "
        "run that did not exit",
        "pick another port (torchrun --master_port 29501, deepspeed --master_port 29501) or "
        "end the leftover processes",
        'ss -ltnp | grep -w "${MASTER_PORT:-29500}"'),
    # -- communication between ranks ------------------------------------------------------
    Signature(
        "nccl-duplicate-gpu", "nccl-comm",
        (r"Duplicate GPU detected", r"ncclInvalidUsage"),
        "two ranks use the same GPU (NCCL invalid usage)",
        "run one rank per GPU: --nproc_per_node / --num_gpus at most the GPU count, and "
        "each rank on cuda:LOCAL_RANK (dalle_dist does this; custom code must call "
        "torch.cuda.set_device(local_rank))",
        "nvidia-smi -L"),
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
        _NCCL_CHECK),
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
        "grep -nE 'error:|Traceback|Killed|exit ?code' LOGFILE | head"),
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
        _HOROVOD_CHECK),
    Signature(
        "horovod-shut-down", "nccl-comm",
        (r"Horovod has been shut down\. This was caused by an exception on one of the ranks",),
        "Horovod shut down while this rank still called a collective: another rank raised, "
        "died, stalled past the stall shutdown time, or finished early (an early stop or "
        "fewer batches on one rank)",
        "find the first rank's own error above the first shutdown message; make every rank "
        "run the same number of steps and stop together",
        _HOROVOD_CHECK),
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
        "print(t.item())\""),
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
        benign=True),
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
        _NCCL_CHECK),
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
        fallback=True),
    # -- other known failures -------------------------------------------------------------
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
        "dmesg -T | grep -i 'killed process'"),
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
        "df -h ."),
    Signature(
        "checkpoint-file-unwritable", "other",
        (r"File .+ cannot be opened\.",),   # torch.save's PyTorchFileWriter
        "torch.save could not create its file: the disk is full, or the folder is missing "
        "or not writable",
        "free space or point the output elsewhere (--keep_n_checkpoints limits old "
        "checkpoints), and check that the output folder exists and is writable",
        "df -h .; ls -ld OUTPUT_DIR"),
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
        "df -h /dev/shm"),
    Signature(
        "nan-loss", "other",
        (_NAN_LOSS,
         r"returned nan values in its \d+th output",
         r"Loss became infinite or NaN"),   # detectron2's trainer
        "the loss became NaN and the log shows no fp16: the learning rate is too high or a "
        "batch holds bad values (or fp16 autocast was on by default, unseen in the log)",
        "lower --learning_rate, keep --clip_grad_norm, and check the data; if the code runs "
        "under fp16 autocast, try bf16 or fp32; resume from a checkpoint saved before the NaN",
        "grep -in 'nan' LOGFILE | head"),
    Signature(
        "dalle-dist-error", "other",
        (r"^error: (?P<what>.*?) \((?P<fix>(?:[^()]|\([^()]*\))*)\)$",),
        "dalle-dist stopped: {what}",
        "{fix}",
        "dalle-dist check"),
    # -- harmless warnings ----------------------------------------------------------------
    Signature(
        "ds-overflow-skip", BENIGN,
        (r"\[deep(?:speed|scale)\] OVERFLOW! (?:Rank \d+ )?Skipping step",
         r"\[deep(?:speed|scale)\] fp16 dynamic loss scale overflow! Skipping step",
         r"Grad overflow on iteration:? \d+",
         r"[Oo]verflow detected\. Skipping step\. Attempted loss scale",
         r"Reducing dynamic loss scale from [\d.e+-]+ to",
         r"[Ff]ound overflow\. Skip step",
         r"(?i)overflow detected, setting (?:loss )?scale to",
         r"(?i)overflow occurs?, the loss scale is adjusted to"),
        "DeepSpeed's dynamic fp16 loss scaler skipped a step and lowered the scale: normal "
        "in the first steps of fp16 training",
        "nothing, unless the scale keeps falling to its minimum (then see fp16-overflow)",
        "grep -c 'OVERFLOW' LOGFILE",
        benign=True),
    Signature(
        "apex-gradient-overflow", BENIGN,
        (r"Gradient overflow[.,]?\s+[Ss]kipping step,? loss scaler \d+ reducing loss scale "
         r"to",),
        "Apex amp's dynamic loss scaler skipped a step and halved the scale: normal early "
        "in fp16 training",
        "nothing, unless the scale keeps falling below 1 (then see fp16-overflow)",
        "grep -c 'Gradient overflow' LOGFILE",
        benign=True),
    Signature(
        "torchrun-omp-threads", BENIGN,
        (r"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",),
        "torchrun set OMP_NUM_THREADS=1 per process: a tuning notice, not an error",
        "nothing; export OMP_NUM_THREADS yourself to choose the value",
        "echo $OMP_NUM_THREADS",
        benign=True),
    Signature(
        "ds-cuda-minor-mismatch-accepted", BENIGN,
        (r"but since the APIs are compatible, accepting this combination",),
        "DeepSpeed found a CUDA toolkit of the same major version as torch's and accepted it",
        "nothing",
        "nvcc --version",
        benign=True),
    Signature(
        "ds-launcher-notices", BENIGN,
        (r"Unable to find hostfile, will proceed with training with local resources only",
         r"async_io requires the dev libaio \.so object and headers but these were not found",
         r"please install the libaio-dev package with apt"),
        "DeepSpeed notices about optional features (hostfile, async_io) that this run "
        "does not use",
        "nothing",
        "ds_report",
        benign=True),
)
