"""DeepSpeed absent or unimportable (deepspeed-missing), its C++/CUDA ops failing to build
(deepspeed-op-build), and its harmless launcher and op-builder notices.

Op builds rank 500s, a missing DeepSpeed 600s. deepspeed-torch-too-new-wrapped ranks 830,
among Apex's entries, right after apex-torch-too-new (825): both read a torch._six error,
and when Apex's frames show beside transformers' wrapped import, Apex's reading wins. The
notices rank with the other harmless warnings (1500s).
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import BENIGN, Signature

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

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "ds-cuda-home-missing", "deepspeed-op-build",
        (r"CUDA_HOME does not exist, unable to compile CUDA op",
         r"MissingCUDAException"),
        "DeepSpeed tried to compile a CUDA op but finds no CUDA toolkit (CUDA_HOME unset, "
        "no nvcc)",
        "install the CUDA toolkit matching torch.version.cuda and export CUDA_HOME, or use "
        "a DeepSpeed wheel with prebuilt ops, or avoid the op",
        "echo $CUDA_HOME; nvcc --version; ds_report",
        priority=500),
    Signature(
        "ds-cuda-toolkit-mismatch", "deepspeed-op-build",
        (r">- DeepSpeed Op Builder: Installed CUDA version [\d.]+ does not match",
         r"unable to compile cuda/cpp extensions without a matching cuda version",
         r"CUDAMismatchException"),
        "the CUDA toolkit (nvcc) differs in major version from the CUDA torch was built "
        "with, so DeepSpeed refuses to compile its ops",
        "install the toolkit matching torch.version.cuda (or a torch matching the "
        "toolkit) and point CUDA_HOME at it",
        'nvcc --version; python -c "import torch; print(torch.version.cuda)"',
        priority=505),
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
        requires=_DS_BUILD_CONTEXT,
        priority=510),
    Signature(
        "ds-ninja-missing", "deepspeed-op-build",
        (r"Unable to JIT load the (?P<op>\w+) op due to ninja not being installed",
         r"Ninja is required to load C\+\+ extensions"),
        "DeepSpeed builds its ops just in time with ninja, which is not installed",
        "pip install ninja (and make sure `ninja --version` runs in the job's environment)",
        "ninja --version; ds_report",
        priority=515),
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
        requires=_DS_BUILD_CONTEXT,
        priority=520),
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
        "dalle-dist check --backend deepspeed",
        priority=600),
    Signature(
        "deepspeed-version-pin", "deepspeed-missing",
        (r"\bdeepspeed\s*[<>=!~]=?\s*[\d.]+[^\n]*\bis required\b",
         r"\bdeepspeed[<>=!~]=?[\d.]+[^\n]*\bbut found deepspeed",
         r"(?i)requires? deepspeed\s*[<>=!~]=?\s*[\d.]+"),
        "the installed DeepSpeed is outside the version range this code requires",
        "install a DeepSpeed release in the required range (pip install 'deepspeed<x,>=y' as "
        "the error line says), or use dalle_dist's own backends",
        'python -c "import deepspeed; print(deepspeed.__version__)"',
        priority=605),
    Signature(
        "deepspeed-torch-too-new", "deepspeed-missing",
        (r"No module named '?torch\._six'?",
         r"cannot import name '\w+' from 'torch\._six'"),
        "this DeepSpeed release imports torch._six, which torch 2.0 removed: DeepSpeed is "
        "too old for the installed torch and cannot be imported",
        "upgrade DeepSpeed (pip install -U deepspeed) or pin torch below 2.0",
        'python -c "import deepspeed, torch; print(deepspeed.__version__, torch.__version__)"',
        requires=(r"[/\\]deepspeed[/\\][\w/\\]+\.py",),
        priority=610),
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
        requires=(r"(?i)(?:Collecting|Downloading|Using cached)\s+\S*deepspeed",),
        priority=615),
    # transformers imports DeepSpeed (its integration) inside a lazy import and reports only
    # "Failed to import transformers...: No module named 'torch._six'"; its own code never
    # imported torch._six. After apex-torch-too-new (825), which wins when Apex frames show.
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
        requires=(r"Failed to import transformers\.",),
        priority=830),
    Signature(
        "ds-cuda-minor-mismatch-accepted", BENIGN,
        (r"but since the APIs are compatible, accepting this combination",),
        "DeepSpeed found a CUDA toolkit of the same major version as torch's and accepted it",
        "nothing",
        "nvcc --version",
        benign=True,
        priority=1515),
    Signature(
        "ds-launcher-notices", BENIGN,
        (r"Unable to find hostfile, will proceed with training with local resources only",
         r"async_io requires the dev libaio \.so object and headers but these were not found",
         r"please install the libaio-dev package with apt"),
        "DeepSpeed notices about optional features (hostfile, async_io) that this run "
        "does not use",
        "nothing",
        "ds_report",
        benign=True,
        priority=1520),
)
