"""DeepSpeed's sparse attention and Triton (sparse-attn-triton), and libraries that only
note that Triton is absent (benign).

The notes rank first (400, 405): a library that runs on without Triton quotes the same
ImportError triton-missing reads, and a line is harmless or a failure as the entry of
lowest priority says.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import BENIGN, Signature

SIGNATURES: tuple[Signature, ...] = (
    # A library that only uses Triton when it is there (xformers) says so and carries on;
    # ranked first, it claims the ImportError it quotes.
    Signature(
        "triton-optional-missing", BENIGN,
        (r"A matching Triton is not available",
         r"No module named '?triton'?(?![.\w])"),
        "a library (xformers) found no usable Triton and runs without its Triton kernels: "
        "slower paths, nothing fails",
        "nothing; install the Triton matching torch only for those optimisations",
        'python -c "import triton; print(triton.__version__)"',
        benign=True,
        requires=(r"A matching Triton is not available",),
        priority=400),
    Signature(
        "triton-optional-notice", BENIGN,
        (r"(?i)\btriton is not (?:available|installed)\b[^\n]*\b(?:some optimi[sz]ations|"
         r"will not be (?:enabled|used)|fall(?:ing)? ?back|disabled)",
         r"(?i)just a warning:? triton is not (?:available|installed)"),
        "a library found no Triton and runs without its Triton kernels: slower at most, "
        "nothing fails",
        "nothing; install the Triton matching torch only for those optimisations",
        'python -c "import triton; print(triton.__version__)"',
        benign=True,
        priority=405),
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
        'python -c "import torch, triton; print(torch.__version__, triton.__version__)"',
        priority=410),
    # Triton builds a small C launcher the first time any Triton kernel runs (torch.compile
    # on CUDA, FlexAttention), with $CC, else gcc, else clang.
    Signature(
        "triton-c-compiler-missing", "sparse-attn-triton",
        (r"Failed to find C compiler\. Please specify via CC",),
        "Triton found no C compiler: it builds a launcher for its kernels with $CC, else gcc "
        "or clang, the first time torch.compile or FlexAttention runs on the GPU (slim and "
        "CUDA runtime containers ship none)",
        "install gcc (apt-get install gcc, or build-essential) or point CC at a C compiler; "
        "or run without compiled kernels (dalle-dist: no --compile, --attn_impl gather)",
        "${CC:-gcc} --version",
        priority=412),
    Signature(
        "triton-missing", "sparse-attn-triton",
        (r"No module named '?triton'?(?![.\w])",),
        "Triton is not installed, and DeepSpeed's sparse attention kernels need it",
        "drop DeepSpeed's kernel: dalle_dist's --attn_types sparse runs as a block mask "
        "(SDPA on CPU, FlexAttention on CUDA) and needs no Triton; otherwise install the "
        "Triton version your DeepSpeed release pins",
        'python -c "import triton; print(triton.__version__)"',
        priority=415),
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
        'python -c "import triton; print(triton.__version__)"',
        priority=420),
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
        "ds_report | grep -i sparse",
        priority=425),
    Signature(
        "ds-sparse-attention-fp16-only", "sparse-attn-triton",
        (r"(?i)sparse attention only supports (?:training in )?fp16",),
        "DeepSpeed's sparse attention (its Triton kernels) runs in fp16 only, and this run "
        "gave it fp32 tensors (often at sampling or evaluation time, outside the fp16 "
        "engine); older DeepSpeed and Triton releases are needed for it at all",
        "run the model in fp16 where it uses DeepSpeed's sparse attention, or use "
        "dalle_dist's mask-based sparse pattern (--attn_types), which needs no DeepSpeed "
        "kernel and runs in any precision",
        "ds_report | grep -i sparse",
        priority=430),
)
