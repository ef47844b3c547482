"""NVIDIA Apex absent, built without its extensions, or the unrelated PyPI `apex`
(apex-missing-or-wrong), and Apex's harmless fallback notices.

Ranks 800s. The notices rank first (800-810): Apex's own fallback warning quotes the
ImportError of amp_C, and libraries that use Apex only when it is there say it is missing
and carry on; a line is harmless or a failure as the entry of lowest priority says, so the
notices claim those lines before apex-extensions-missing and apex-not-installed read them.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import BENIGN, Signature

SIGNATURES: tuple[Signature, ...] = (
    # Apex's fallback warning quotes the ImportError of amp_C: ranked first, it claims the line.
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
        benign=True,
        priority=800),
    # Libraries that use Apex only when it is there say it is missing and carry on
    # (Megatron's "Apex is not installed. Falling back to Torch LayerNorm"); ranked before
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
        benign=True,
        priority=805),
    Signature(
        "dalle-dist-amp-fallback", BENIGN,
        (r"--amp: (?:NVIDIA Apex with apex\.amp is not importable|Apex amp needs CUDA)",),
        "dalle-dist used torch.autocast fp16 with a gradient scaler because Apex amp is not "
        "usable here: same training, no Apex",
        "nothing; pass --precision fp16 instead of --amp to skip the message",
        'python -c "from apex import amp"',
        benign=True,
        priority=810),
    Signature(
        "deepspeed-amp-removed", "apex-missing-or-wrong",
        (r"NVIDIA Apex AMP integration has been removed",
         r"--deepspeed_config has an 'amp' block"),
        "the DeepSpeed config has an 'amp' block (Apex amp), which DeepSpeed no longer "
        "accepts",
        "remove the 'amp' block and use --precision bf16 (or fp16) instead",
        "grep -n '\"amp\"' YOUR_DS_CONFIG.json",
        priority=815),
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
        'python -c "import apex, sys; print(apex.__file__)"',
        priority=820),
    Signature(
        "apex-torch-too-new", "apex-missing-or-wrong",
        (r"No module named '?torch\._six'?",
         r"cannot import name '\w+' from 'torch\._six'"),
        "this Apex build imports torch._six, which torch 2.0 removed: Apex is too old for "
        "the installed torch",
        "rebuild NVIDIA Apex from a current checkout, or use native mixed precision "
        "(--precision fp16 or bf16)",
        'python -c "import apex"',
        requires=(r"[/\\]apex[/\\][\w/\\]+\.py",),
        priority=825),
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
        'python -c "import apex, sys; print(apex.__file__, hasattr(apex, \'amp\'))"',
        priority=835),
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
                  r"\bfrom apex import\b", r"^\s*import apex\b"),
        priority=840),
    Signature(
        "apex-build-cuda-mismatch", "apex-missing-or-wrong",
        (r"Cuda extensions are being compiled with a version of Cuda that does not match the "
         r"version used to compile Pytorch binaries",),
        "NVIDIA Apex's extensions did not build: the CUDA toolkit (nvcc) differs from the "
        "CUDA torch was built with, so Apex is missing or lacks its extensions",
        "use native mixed precision (--precision fp16 or bf16), which needs no Apex; or "
        "install the toolkit matching torch.version.cuda and rebuild Apex",
        'nvcc --version; python -c "import torch; print(torch.version.cuda)"',
        priority=845),
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
        'python -c "import amp_C, fused_layer_norm_cuda"',
        priority=850),
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
        'python -c "import torch, amp_C; print(torch.__version__)"',
        priority=855),
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
        'python -c "import apex"',
        priority=860),
)
