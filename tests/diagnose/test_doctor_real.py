"""`dalle-dist doctor` on logs users really posted, and the reading rules issue 15 added.

real/<set>/ holds logs copied from GitHub threads (trimmed to the failing part, prefixes
and colours kept), listed in real/<set>/SOURCES.json with the thread and the evidence
there for the category. `dev`: from DeepSpeed, PyTorch, Horovod, Apex and DALLE-pytorch,
the repositories the signatures were written against. `outside`: from other projects,
collected apart as the first held-out set and scored once before anyone read it (61/77 =
0.79); since then signatures are written against it too. `heldout`: from yet other
projects, collected apart and scored blind once (40/48 = 0.833); round 3 of the signatures
was written against its misses. `blind`: 50 logs from 49 further repositories, collected
apart while round 3 was written (the collector never ran doctor) and scored once after it
(44/50 = 0.880); round 4 was written against its misses, so it is no longer blind either.
`blind2`: 45 logs from 44 more repositories, collected apart while round 4 was written and
scored once after it (30/45 = 0.667); round 5 was written against its misses, so it is no
longer blind. `blind3`: 40 logs from 39 more repositories, scored once after round 5
(36/40 = 0.900), the current honest measure. Every set that is present
is scored against its threshold in THRESHOLDS; a set expected but not yet
merged is listed in PENDING_SETS, so its absence is stated here, not skipped silently,
and its arrival fails test_real_sets_are_the_expected_ones until it is taken off the list.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

import pytest

from dalle_dist.cli.doctor_cmd import UNKNOWN_NEXT_STEPS, run_doctor
from dalle_dist.doctor.cleaning import normalise_punctuation
from dalle_dist.doctor.diagnosis import diagnose
from dalle_dist.doctor.signatures import BENIGN, CATEGORIES, UNKNOWN
from tests.diagnose.corpus import SOURCE_KEYS, real_set, real_sets, score, sources

REAL = Path(__file__).parent / "real"
#: The least accuracy each real set must reach.
#: heldout: issue 15 asks for 0.9. Scored blind once, after the outside round, doctor read
#: 40 of its 48 logs right (0.833). Round 3 then wrote signatures against its misses (46/48,
#: 0.958), so like outside it is no longer a blind measure: a fresh set from other
#: repositories scores the next round. The two logs still missed show their cause only in
#: the thread (a bare torch._six ImportError; a NaN loss with fp16 autocast on by default).
#: blind: scored blind once, after round 3: 44/50 (0.880), every miss an abstention
#: (`unknown`), no wrong category. Round 4 then wrote rules against its misses (typographic
#: punctuation made plain, Apex amp used after a failed import, Apex without its
#: extensions, no ZeRO files found): 49/50 (0.980), so it no longer predicts unseen logs;
#: the next fresh set from other repositories does. Its one miss stays `unknown` on
#: purpose: a Chinese-only notice of one project that DeepSpeed failed to load and it fell
#: back (the thread calls it harmless); no language-independent line says so.
#: blind2: scored blind once, after round 4: 30/45 (0.667), again every miss an abstention,
#: no wrong category. Its misses: wordings of other projects for known causes (a loss
#: scale halving as guided-diffusion's "decreased lg_loss_scale", allennlp's "could not
#: import apex", a batch-divisibility assert without DeepSpeed's words, Triton missing as
#: "Triton is not available"), long lines hard-wrapped in the paste (an NCCL watchdog
#: timeout split mid-word), and logs cut before their error line. Round 5 then wrote rules
#: against those misses in general wordings (a loss scale decreased in words or as log2,
#: ninja's FAILED object in a DeepSpeed build, Horovod's pip build erroring, Python 2 and
#: allennlp wordings of Apex missing, a script's batch-divisibility assert, verl's equal
#: chunk, mixed precision on CPU, NameError deepspeed, Triton and DDP grad-stride notices,
#: a watchdog line wrapped after "collective"): 43/45 (0.956), no longer blind. Its two
#: misses stay `unknown` on purpose, the evidence being outside the stored log: tacotron2's
#: overflow lines stop at a scale of 262144 (warm-up range; the collapse to 1 is only in the
#: thread's words), and groundingLMM's log ends at "Building extension module fused_adam"
#: (the build error is only in the thread).
#: blind3: 40 logs from 39 more repositories, collected while round 5 was written and
#: scored blind once after it: 36/40 (0.900), issue 15's goal. Two misses are wrong
#: categories (a Chinese-language DeepSpeed fall-back notice read as deepspeed-missing; a
#: failing `python -m deepspeed` on Windows, labelled launcher-args, read as
#: deepspeed-missing), two are abstentions (mmagic's batch-size title; the second copy of
#: the Chinese notice). The floor until a round is written against it.
THRESHOLDS = {"dev": 0.97, "outside": 0.97, "heldout": 0.95, "blind": 0.98, "blind2": 0.95,
              "blind3": 0.90}
#: Sets expected but not merged yet (collected on another branch).
PENDING_SETS: set[str] = set()
PRESENT = real_sets(REAL)
DEV_REPOS = {"deepspeedai/DeepSpeed", "microsoft/DeepSpeed", "pytorch/pytorch",
             "horovod/horovod", "NVIDIA/apex", "lucidrains/DALLE-pytorch"}
#: What dev must hold: logs, real failures outside the categories, logs per category.
DEV_MIN_LOGS, DEV_MIN_UNKNOWN, DEV_MIN_PER_CATEGORY = 95, 10, 5
#: Categories with fewer real dev logs than DEV_MIN_PER_CATEGORY, and how many they have:
#: few threads in the dev repositories paste these failures whole.
DEV_SHORT = {"launcher-args": 4, "batch-size": 4}
URL = re.compile(r"^https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/"
                 r"(?:issues|pull|discussions)/(?P<number>\d+)(?:#[\w-]+)?$")


# -- the sets ---------------------------------------------------------------------------------

def test_real_sets_are_the_expected_ones() -> None:
    """Fails when dev is missing, when a set arrives that has no threshold, or when a
    pending set (heldout) is merged while still listed as pending: then take it off
    PENDING_SETS, so that from then on its absence fails too."""
    assert "dev" in PRESENT
    assert set(PRESENT) == set(THRESHOLDS) - PENDING_SETS, (
        f"real sets present: {sorted(PRESENT)}; expected {sorted(set(THRESHOLDS))} less "
        f"pending {sorted(PENDING_SETS)}")


@pytest.mark.parametrize("name", sorted(PRESENT))
def test_real_set_accuracy(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """doctor reads every log of the set without an exception and gets at least the
    set's threshold right; prints per-category accuracy and what it confused. Fails when
    a signature stops matching the real wording (a pattern keyed on a version or path)."""
    result = score(real_set(PRESENT[name]))
    table = "\n".join(f"  {c:30s} {ok:3d}/{n:<3d}"
                      for c, (ok, n) in sorted(result.per_category.items()))
    missed = "\n".join(f"  {c['file']}: {c['expected']} -> {c['got']}"
                       for c in result.confusions)
    with capsys.disabled():
        print(f"\ndoctor on real set {name}: {result.accuracy:.3f} over {result.total} logs\n"
              f"{table}\nconfused:\n{missed or '  none'}")
    assert result.accuracy >= THRESHOLDS[name], missed


@pytest.mark.parametrize("name", sorted(PRESENT))
def test_real_set_sources(name: str) -> None:
    """Every log is listed once in SOURCES.json with a GitHub thread, a known category,
    the thread's evidence, and a file name starting with its category; every listed
    file exists. Fails on an unlisted log, a listed file that is gone, a category doctor
    does not have, or a source without its thread."""
    directory = PRESENT[name]
    entries = sources(directory)
    files = [e["file"] for e in entries]
    assert len(files) == len(set(files)), [f for f, n in Counter(files).items() if n > 1]
    assert set(files) == {p.name for p in directory.glob("*.log")}
    for entry in entries:
        assert set(entry) == set(SOURCE_KEYS), entry
        assert entry["category"] in {*CATEGORIES, BENIGN, UNKNOWN}, entry
        assert entry["file"].startswith(entry["category"] + "__"), entry
        assert URL.match(entry["url"]), entry
        assert entry["evidence"].strip(), entry
        assert (directory / entry["file"]).read_text(errors="replace").strip(), entry


def test_dev_set_counts_and_repositories() -> None:
    """dev holds enough logs, enough real failures outside the categories (unknown), the
    least per category (DEV_SHORT names the shortfalls), all from the dev repositories,
    each file named after its thread."""
    entries = sources(REAL / "dev")
    counts = Counter(e["category"] for e in entries)
    assert len(entries) >= DEV_MIN_LOGS
    assert counts[UNKNOWN] >= DEV_MIN_UNKNOWN
    for category in (*CATEGORIES, BENIGN):
        assert counts[category] >= DEV_SHORT.get(category, DEV_MIN_PER_CATEGORY), (
            category, counts[category])
    for entry in entries:
        m = URL.match(entry["url"])
        assert m and m["repo"] in DEV_REPOS, entry
        owner_repo = m["repo"].replace("/", "-")
        assert re.fullmatch(rf"{re.escape(entry['category'])}__{re.escape(owner_repo)}-"
                            rf"{m['number']}(?:-\d+)?\.log", entry["file"]), entry



#: Each held-out set: the sets (besides the five dev repositories) whose repositories it
#: must not share, its least size and its least count of real failures outside the
#: categories. `outside` was the first held-out set, `heldout` the second, `blind` the third.
HELD_OUT_SETS = {"outside": (("dev",), 60, 8), "heldout": (("dev", "outside"), 45, 6),
                 "blind": (("dev", "outside", "heldout"), 45, 6),
                 "blind2": (("dev", "outside", "heldout", "blind"), 45, 6),
                 "blind3": (("dev", "outside", "heldout", "blind", "blind2"), 40, 6)}


@pytest.mark.parametrize("name", sorted(HELD_OUT_SETS))
def test_held_out_sets_come_from_unused_repositories(name: str) -> None:
    """A held-out set measures doctor on logs from projects nobody wrote signatures
    against. Fails on a log from a repository of an earlier set or of the five dev
    repositories (the figure would be optimistic), two logs from one thread (one report
    weighed twice), a file named after another thread than its source, or a set trimmed
    below its size or its share of `unknown` (answering unknown would look free). Reads
    SOURCES.json only: choosing or labelling a log never depends on what doctor answers."""
    earlier, least_logs, least_unknown = HELD_OUT_SETS[name]
    used = {repo.lower() for repo in DEV_REPOS}
    for other in earlier:
        used |= {URL.match(e["url"])["repo"].lower() for e in sources(REAL / other)}
    entries = sources(REAL / name)
    threads = Counter(e["url"] for e in entries)
    assert [url for url, n in threads.items() if n > 1] == []
    for entry in entries:
        m = URL.match(entry["url"])
        assert m and m["repo"].lower() not in used, entry["url"]
        owner_repo = m["repo"].replace("/", "-")
        assert re.fullmatch(rf"{re.escape(entry['category'])}__{re.escape(owner_repo)}-"
                            rf"{m['number']}(?:-\d+)?\.log", entry["file"]), entry
    counts = Counter(e["category"] for e in entries)
    assert len(entries) >= least_logs and counts[UNKNOWN] >= least_unknown, counts

# -- the reading rules issue 15 added -----------------------------------------------------------

SPARSE_WARNING = (" [WARNING]  sparse_attn requires a torch version >= 1.5 and < 2.0 but "
                  "detected 2.1")
BATCH_ASSERT = ("AssertionError: Check batch related parameters. train_batch_size is not equal "
                "to micro_batch_per_gpu * gradient_acc_step * world_size 8 != 4 * 1 * 4")


@pytest.mark.parametrize("prefix", [
    "[rank3]: ", "[default0]:", "[1,0]<stderr>:", "<stderr>:", "2024-05-01T12:00:00.123Z ",
    "2024-05-01 12:00:00,123 - ERROR - ", "E0213 12:07:20.086000 42 api.py:874] ",
    "[2023-06-01 10:00:00,123] [ERROR] [engine.py:12:f] ", "node3: [rank2]: ", "> ",
    "\x1b[31m[rank0]: \x1b[0m",
], ids=["torchrun", "torchrun-default", "horovodrun", "stderr", "iso-time", "logging",
        "glog", "deepspeed-logger", "pdsh", "quoted", "ansi"])
def test_prefixes_are_stripped_before_reading(prefix: str) -> None:
    """An exception line keeps its place (it beats a warning listed earlier in SIGNATURES)
    whatever launcher, logger or CI put before it. Fails when a prefix is not removed:
    the raised line then reads as a plain line and the sparse_attn warning decides."""
    diagnosis = diagnose(f"{SPARSE_WARNING}\n{prefix}{BATCH_ASSERT}\n")
    assert diagnosis.category == "batch-size", diagnosis
    assert diagnosis.alternatives[0].category == "sparse-attn-triton"


def _overflows(start: int, halvings: int) -> str:
    lines = []
    for i in range(halvings):
        scale = start // 2 ** i
        lines.append(f"[2024-01-01 00:00:0{i % 10},000] [INFO] [loss_scaler.py:183:"
                     f"update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted "
                     f"loss scale: {scale}, reducing to {scale // 2}")
    return "\n".join(lines) + "\n"


def test_loss_scale_collapse_is_a_sequence() -> None:
    """A few warm-up overflows are harmless; the scale halved overflow after overflow
    down to the floor is fp16 divergence, decided on the line where the scale reaches it.
    Fails when the sequence signature is lost (all overflows benign) or when any
    overflow line counts as a collapse (warm-up read as a failure)."""
    warm_up = diagnose(_overflows(2 ** 16, 4) + "epoch 1 loss 3.2\n")
    assert warm_up.category == BENIGN
    collapse = diagnose(_overflows(2 ** 16, 13))  # 65536 down to 8
    assert (collapse.category, collapse.signature) == ("fp16-overflow",
                                                       "ds-loss-scale-collapse")
    assert "reducing to 8" in collapse.matches[0].text
    assert "down to 8" in collapse.cause
    apex = diagnose("\n".join(f"Gradient overflow.  Skipping step, loss scaler 0 reducing "
                              f"loss scale to {2.0 ** -i}" for i in range(3)))
    assert (apex.category, apex.signature) == ("fp16-overflow", "apex-loss-scale-collapse")


def test_a_catch_all_decides_only_when_nothing_specific_matched() -> None:
    """Any NCCL error is a catch-all (nccl-error): an OOM on a plain line beats it even
    though the NCCL error is an exception line. Fails when `fallback` is ignored."""
    oom = "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)"
    nccl = ("RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
            "unhandled cuda error, NCCL version 2.7.8")
    diagnosis = diagnose(f"{oom}\n{nccl}\n")
    assert diagnosis.category == "cuda-oom"
    assert diagnosis.alternatives == (type(diagnosis.alternatives[0])("nccl-comm", nccl),)
    assert diagnose(nccl).signature == "nccl-error"
    assert diagnose(nccl).confidence < 0.9


def test_harmless_warnings_and_an_unknown_error_are_unknown() -> None:
    """Warm-up overflows do not make a run that raised something else `benign`: its error
    is named and the category is unknown. Fails when benign ignores the exception."""
    diagnosis = diagnose(_overflows(2 ** 16, 2) + "ValueError: the tokenizer has no <pad>\n")
    assert diagnosis.category == UNKNOWN
    assert diagnosis.cause.endswith("(its error is: ValueError: the tokenizer has no <pad>)")
    assert diagnosis.confidence == 0.0 and diagnosis.alternatives == ()


def test_confidence_is_lower_when_another_category_is_as_telling() -> None:
    """A clear reading is confident; when a second category matches an equally telling
    line, confidence drops and that category is offered as an alternative with its line.
    Fails when confidence ignores rival readings or alternatives are not reported."""
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
           "a total capacity of 79.15 GiB of which 1.2 GiB is free.")
    clear = diagnose(oom)
    assert clear.confidence == 0.9 and clear.alternatives == ()
    rival = "ModuleNotFoundError: No module named 'deepspeed'"
    close = diagnose(f"{oom}\n{rival}\n")
    assert close.confidence < clear.confidence
    assert [(a.category, a.line) for a in close.alternatives] == [
        ("deepspeed-missing" if close.category == "cuda-oom" else "cuda-oom",
         rival if close.category == "cuda-oom" else oom)]


def test_unknown_human_output_says_what_to_run_and_paste(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """For a log doctor does not know, the human output names `dalle-dist check` and
    what to paste (command, first failing rank's traceback, torchrun's Root Cause), and
    shows no confidence. Fails when the next steps are dropped."""
    log = tmp_path / "run.log"
    log.write_text("Segmentation fault (core dumped)\n")
    status = run_doctor(argparse.Namespace(logfile=str(log), json=False))
    out = capsys.readouterr().out
    assert status == 1
    assert "next steps:" in out and "confidence" not in out
    assert all(step in out for step in UNKNOWN_NEXT_STEPS)
    assert "dalle-dist check" in UNKNOWN_NEXT_STEPS[0]
    assert all(word in UNKNOWN_NEXT_STEPS[1] for word in ("command", "Traceback", "Root Cause"))


@pytest.mark.parametrize(("line", "category"), [
    ("RuntimeError: `DeepSpeedStrategy` requires `deepspeed`. Install it by running "
     "`pip install -U deepspeed`.", "deepspeed-missing"),
    ("ImportError: Please install apex from https://www.github.com/nvidia/apex to use fp16 "
     "training.", "apex-missing-or-wrong"),
    ("ImportError: cannot import name 'FusedLayerNorm' from 'apex.normalization'",
     "apex-missing-or-wrong"),
    ("KeyError: 'LOCAL_RANK'", "launcher-args"),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 0 "
     "(pid: 1234) of binary: /usr/bin/python", "other"),
    ("ImportError: /root/.cache/torch_extensions/py310_cu118/fused_adam/fused_adam.so: cannot "
     "open shared object file: No such file or directory", "deepspeed-op-build"),
    ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
     "cuda-unavailable-or-mismatch"),
], ids=["strategy-requires-deepspeed", "install-apex", "apex-name", "launcher-key",
        "sigbus", "jit-cache", "gpu-busy"])
def test_engine_wordings_beyond_the_dev_repositories(line: str, category: str) -> None:
    """Wordings of the same failures by the libraries around the engines (a Lightning
    strategy, transformers' Apex hint, a script reading the launcher's variables, torchrun
    reporting SIGBUS, a stale JIT build): fails when a signature keys on one library's
    sentence only."""
    assert diagnose(line).category == category


@pytest.mark.parametrize(("line", "category"), [
    ("ImportError: DeepSpeed is not available => install it using `pip3 install deepspeed` "
     "or build it from source", "deepspeed-missing"),
    ("lightning.fabric.utilities.exceptions.MisconfigurationException: To use the "
     "`DeepSpeedStrategy`, you must have DeepSpeed installed. Install it by running "
     "`pip install -U deepspeed`.", "deepspeed-missing"),
    ("RuntimeError: Failed to import transformers.models.llama.modeling_llama because of "
     "the following error (look up to see its traceback):\nNo module named 'torch._six'",
     "deepspeed-missing"),
    ("AssertionError: global batch size (12) is not divisible by micro batch size (4) times "
     "data parallel size (2)", "batch-size"),
    ("AssertionError: Data dict size (6) is not a multiple of the provided microbatch size "
     "(4)", "batch-size"),
    ("model.embed_tokens.weight : torch.Size([0])\nmodel.norm.weight : torch.Size([0])",
     "zero-checkpoint"),
    ("Building extension module cpu_adam...\n~/lib/python3.10/site-packages/torch/utils/"
     "cpp_extension.py in _run_ninja_build(build_directory, verbose, error_prefix)",
     "deepspeed-op-build"),
    ("FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably "
     "exploding.", "fp16-overflow"),
    ("ImportError: cannot import name 'get_cuda_stream' from 'triton.runtime.jit'",
     "sparse-attn-triton"),
    ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\nRuntimeError: "
     "Cannot find a working triton installation. Either the package is not installed or it "
     "is too old.", "sparse-attn-triton"),
    ("ImportError: DLL load failed while importing libtriton: The specified module could "
     "not be found.", "sparse-attn-triton"),
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", "cuda-oom"),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GB)", "cuda-oom"),
    ("RuntimeError: Attempting to deserialize object on a CUDA device but "
     "torch.cuda.is_available() is False. If you are running on a CPU-only machine, please "
     "use torch.load with map_location=torch.device('cpu')", "cuda-unavailable-or-mismatch"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect "
     "[127.0.1.1]:45123: Connection refused", "nccl-comm"),
    ("RuntimeError: Socket Timeout", "nccl-comm"),
    ("FloatingPointError: Loss became infinite or NaN at iteration=12!", "other"),
    ("cfg.SOLVER.AMP.ENABLED=True --fp16\nFloatingPointError: Loss became infinite or NaN "
     "at iteration=12!", "fp16-overflow"),
    ("Collecting deepspeed\nRuntimeError: The detected CUDA version (12.1) mismatches the "
     "version that was used to compile PyTorch (11.8). Please make sure to use the same CUDA "
     "versions.", "deepspeed-op-build"),
    ("RuntimeError: Cuda extensions are being compiled with a version of Cuda that does not "
     "match the version used to compile Pytorch binaries.  Pytorch binaries were compiled "
     "with Cuda 11.3.", "apex-missing-or-wrong"),
], ids=["accelerate-ds", "lightning-ds", "transformers-six", "megatron-batch",
        "microbatch-multiple", "zero3-size0-listing", "notebook-ninja", "min-loss-scale",
        "triton-name", "inductor-triton", "libtriton", "rocm-oom", "mps-oom",
        "deserialize-no-cuda", "gloo-refused", "c10d-socket-timeout", "detectron-nan",
        "detectron-nan-fp16", "torch-ext-cuda-ds", "apex-build-cuda"])
def test_wordings_of_other_frameworks(line: str, category: str) -> None:
    """The same failures as accelerate, Lightning, transformers' lazy imports, Megatron,
    NeMo, a ZeRO-3 state dict listing, a notebook traceback, fairseq, torch's inductor,
    ROCm/MPS torch, torch.load, gloo, the c10d store and detectron2 word them (issue 15;
    some learnt from the outside set, re-worded here): fails when a signature keys on one
    project's sentence only."""
    assert diagnose(line).category == category


def _steps(template: str, start: float, steps: int) -> str:
    return "\n".join(template.format(start / 2 ** i) for i in range(steps)) + "\n"


@pytest.mark.parametrize("template", [
    "| WARNING: overflow detected, setting loss scale to: {}",          # fairseq
    "AMP: overflow detected, setting scale to: {}",                    # fairseq AMP
    "Overflow occurs, the loss scale is adjusted to {}",               # ColossalAI
    "DLL 2020-06-04 01:04:20.355678 - PARAMETER loss_scale : {}",      # NVIDIA DLLogger
    "| epoch 027 | loss 6.343 | loss_scale {} | wall 23080",            # a stats column
    '{{"step": 3, "loss": 2.1, "loss_scale": {}}}',                    # JSON lines
], ids=["fairseq", "fairseq-amp", "colossalai", "dllogger", "column", "json"])
def test_loss_scale_collapse_in_other_frameworks(template: str) -> None:
    """A scale halved from 2**16 down below 1 is fp16 divergence in every framework's
    wording; the same lines stopping at 2**12 (warm-up) are no failure. Fails when a
    framework's shape is not read as a sequence (collapse missed) or when every such
    line counts (warm-up read as a failure)."""
    assert diagnose(_steps(template, 2.0 ** 16, 20)).category == "fp16-overflow"
    assert diagnose(_steps(template, 2.0 ** 16, 5)).category in (BENIGN, UNKNOWN)


@pytest.mark.parametrize("text", [
    '"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16}',
    "Namespace(fp16=True, loss_scale=0, min_loss_scale=0.0001)",
    "python run_squad.py --fp16 --loss_scale 0.5",
    " iteration 100/ 1000 | lm loss: 2.1E+00 | loss scale: 1.0 | grad norm: 0.9 |",
], ids=["ds-config-dynamic", "namespace", "flag", "megatron-bf16"])
def test_loss_scale_settings_are_not_a_collapse(text: str) -> None:
    """0 is the 'dynamic' setting of DeepSpeed, Apex and transformers configs; a flag or a
    longer name (min_loss_scale) is a setting; bf16/fp32 Megatron prints a static 1.0 every
    step. Fails when the loss-scale column signature reads any of them as a collapse."""
    assert diagnose(text).category == UNKNOWN


def test_optional_triton_notice_is_harmless_but_triton_failures_are_not() -> None:
    """xformers says 'A matching Triton is not available' and carries on: the ImportError
    it quotes (and its traceback) is harmless. Without that notice, the same ImportError
    is Triton missing; a real Triton failure next to the notice still decides. Fails when
    the notice is read as a failure, or when it silences Triton failures everywhere."""
    notice = ("WARNING:xformers:A matching Triton is not available, some optimizations will "
              "not be enabled.\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
              "    import triton\nModuleNotFoundError: No module named 'triton'\n")
    assert diagnose(notice).category == BENIGN
    assert diagnose("ModuleNotFoundError: No module named 'triton'\n").category == \
        "sparse-attn-triton"
    failing = notice + "RuntimeError: Cannot find a working triton installation.\n"
    assert diagnose(failing).category == "sparse-attn-triton"


# -- round 3: the wordings behind the heldout misses, as other projects print them --------------

@pytest.mark.parametrize(("text", "category"), [
    ("ImportError: Using FP16 with APEX but APEX is not installed, please refer to "
     "https://www.github.com/nvidia/apex.", "apex-missing-or-wrong"),
    ("ImportError: Apex was not found. Please see the NeMo README for installation "
     "instructions: https://github.com/NVIDIA/NeMo#megatron-gpt.", "apex-missing-or-wrong"),
    ("Loss is nan, stopping training\n{'loss_ce': tensor(nan, device='cuda:0')}", "other"),
    ("python tools/train.py configs/fp16/mask_rcnn_r50_fpn_fp16_1x_coco.py\n"
     "2021-03-02 10:00:00,000 - mmdet - INFO - Epoch [1][50/7330]\tlr: 1.000e-02, "
     "loss_rpn_cls: nan, loss: nan", "fp16-overflow"),
    ("fp16 = dict(loss_scale=512.0)\nEpoch [1][100/3000] loss_cls: nan, loss: nan",
     "fp16-overflow"),
    ("optim_wrapper = dict(type='AmpOptimWrapper', loss_scale='dynamic')\n"
     "Epoch(train) [1][ 50/500]  loss: nan", "fp16-overflow"),
    ("(ABOVE_NORMAL) Fp16OptimizerHook\nEpoch [2][200/900] loss: nan", "fp16-overflow"),
    ("    scaler.scale(loss).backward()\nLoss is nan, stopping training", "fp16-overflow"),
    ("    self.scaler = torch.cuda.amp.GradScaler(init_scale=2**14)\n"
     "Epoch: [3] loss: nan (nan)", "fp16-overflow"),
    ("FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please use "
     "`torch.amp.autocast('cuda', args...)` instead.\nLoss is nan, stopping training",
     "fp16-overflow"),
    ("    with torch.cuda.amp.autocast(dtype=torch.bfloat16):\nLoss is nan, stopping training",
     "other"),
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/"
     "tcp/pair.cc:144] no error", "nccl-comm"),
    ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.h:210] Connection "
     "refused", "nccl-comm"),
    ("[rank1]:   File \"/workspace/gpt/model/sparse_layer.py\", line 88, in forward\n"
     "[rank1]: AssertionError: sparse attention only supports training in fp16 currently",
     "sparse-attn-triton"),
    ("RuntimeError: File /content/drive/MyDrive/run1/epoch_3.pth cannot be opened.",
     "other"),
    ("RuntimeError: [enforce fail at inline_container.cc:300] . unexpected pos 2918528 vs "
     "2918416", "other"),
    ("ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere "
     "GPU with cuda>=11.0", "cuda-unavailable-or-mismatch"),
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least "
     "8.0. Your Tesla T4 GPU has compute capability 7.5.", "cuda-unavailable-or-mismatch"),
    ("ImportError: /usr/lib/python3/dist-packages/horovod/torch/mpi_lib_v2.cpython-38-x86_64-"
     "linux-gnu.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev", "horovod-not-built"),
    ("ImportError: /usr/local/lib/python3.8/site-packages/fused_layer_norm_cuda.cpython-38-"
     "x86_64-linux-gnu.so: undefined symbol: _ZN2at4_ops5zeros4callE", "apex-missing-or-wrong"),
    ("ImportError: /venv/lib/python3.10/site-packages/deepspeed/ops/adam/cpu_adam_op.cpython-"
     "310-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
     "deepspeed-op-build"),
    ("ImportError: /home/u/.cache/torch_extensions/py39_cu118/cpu_adam/cpu_adam.so: undefined "
     "symbol: _ZN3c104cuda20CUDACachingAllocator9allocatorE", "deepspeed-op-build"),
    ("ValueError: Trying to set a tensor of shape torch.Size([0]) in \"weight\" (which has "
     "shape torch.Size([32000, 4096])), this look incorrect.", "zero-checkpoint"),
    ("ValueError: Some specified arguments are not used by the HfArgumentParser: "
     "['--local-rank=1']", "launcher-args"),
    ("ValueError: Some specified arguments are not used by the HfArgumentParser: "
     "['--lora_rnak', '8']", "launcher-args"),
    ("ValueError: batch_size should be a positive integer value, but got batch_size=0",
     "batch-size"),
    ("RuntimeError: Error building extension 'transformer_inference'",
     "deepspeed-op-build"),
    ("Building extension module fused_adam...\nnvcc fatal   : Unsupported gpu "
     "architecture 'compute_89'", "deepspeed-op-build"),
], ids=["transformers-apex", "nemo-apex", "detr-nan", "mmdet-fp16-config-file",
        "mmcv-fp16-dict", "mmengine-amp-wrapper", "mmcv-fp16-hook", "torch-amp-scaler",
        "torch-amp-gradscaler", "torch-autocast-fp16", "torch-autocast-bf16",
        "gloo-full-mesh", "gloo-header", "ds-sparse-fp32", "torch-save-unwritable",
        "torch-save-disk-full", "transformers-bf16", "vllm-bf16",
        "horovod-undefined-symbol", "apex-undefined-symbol", "ds-prebuilt-undefined-symbol",
        "ds-jit-undefined-symbol", "accelerate-zero3-placeholder", "hf-parser-local-rank",
        "hf-parser-unknown", "batch-sampler-zero", "ds-op-by-name", "ds-op-named-in-build"])
def test_wordings_beyond_the_heldout_logs(text: str, category: str) -> None:
    """Round 3's rules, each in another project's wording than the heldout log that showed
    it was missing: Apex absent as transformers and NeMo say it; a NaN loss as DETR-style
    loops print it; fp16 seen in an fp16 config file name, an mmcv/mmengine config,
    torch's GradScaler or CUDA autocast (not a bf16 one); gloo failing to connect its
    mesh (a header-file location too); DeepSpeed's sparse attention given fp32; torch.save
    unable to write; bf16 asked of a GPU without it (transformers, vLLM); Horovod's, Apex's
    or DeepSpeed's compiled extension built against another torch (undefined symbol);
    accelerate given ZeRO-3 placeholders; transformers' argument parser given torchrun's
    --local-rank or an unknown flag; a per-rank batch rounded to 0; a DeepSpeed op named by
    its op name only. Fails when a rule is removed or keys on one
    log's words."""
    assert diagnose(text).category == category


@pytest.mark.parametrize("text", [
    "nvcc fatal   : Unsupported gpu architecture 'compute_89'",
    "RuntimeError: Error building extension 'upfirdn2d'",
    "ninja: build stopped: subcommand failed.\nsubprocess.CalledProcessError: Command "
    "'['ninja', '-v']' returned non-zero exit status 1.",
    "RuntimeError: The detected CUDA version (12.1) mismatches the version that was used to "
    "compile PyTorch (11.8). Please make sure to use the same CUDA versions.",
    "ImportError: /home/u/.cache/torch_extensions/py39_cu118/upfirdn2d/upfirdn2d.so: "
    "undefined symbol: _ZN3c10",
], ids=["nvcc-arch", "stylegan-op", "ninja", "torch-ext-cuda", "stylegan-stale-build"])
def test_a_build_without_deepspeed_in_the_log_is_no_deepspeed_op(text: str) -> None:
    """torch's extension builder, ninja and nvcc word every project's C++/CUDA build alike
    (a StyleGAN op, a detector's own kernels): without DeepSpeed or one of its op names in
    the log, doctor does not call it a DeepSpeed op (no category fits: unknown). Fails when
    the build signatures lose their DeepSpeed context."""
    assert diagnose(text).category == UNKNOWN


def test_optional_apex_notice_is_harmless() -> None:
    """Megatron and others say Apex is not installed and fall back to torch's kernels:
    a notice, not the failure (benign alone; another failure still decides). Fails when
    the notice reads as Apex missing."""
    notice = "UserWarning: Apex is not installed. Falling back to Torch LayerNorm"
    assert diagnose(notice).category == BENIGN
    assert diagnose(notice + "\ntorch.OutOfMemoryError: CUDA out of memory.").category == \
        "cuda-oom"
    assert diagnose("Apex is not installed.").category == "apex-missing-or-wrong"


def test_hf_parser_given_local_rank_is_the_launcher_flag() -> None:
    """transformers' parser refusing torchrun's `--local-rank` is the local-rank mismatch
    (whose fix says how to accept the flag), not any unknown argument. Fails when only the
    generic bad-arguments reading matches it."""
    line = ("ValueError: Some specified arguments are not used by the HfArgumentParser: "
            "['--local-rank=1']")
    assert diagnose(line).signature == "local-rank-unrecognized"


# -- round 4: what rich text does to a pasted log, and the wordings behind the blind misses -----

@pytest.mark.parametrize(("text", "plain"), [
    ("train.py: error: unrecognized arguments: \u2014local-rank=0",
     "train.py: error: unrecognized arguments: --local-rank=0"),
    ("deepspeed train.py \u2013deepspeed -\u2013fp16 [\u2018\u2013lora_r\u2019]",
     "deepspeed train.py --deepspeed --fp16 ['--lora_r']"),
    ("pages 1\u20135, a \u2013 b, x\u2014y, /tmp/\u2013x, a.\u2013b",
     "pages 1\u20135, a \u2013 b, x\u2014y, /tmp/\u2013x, a.\u2013b"),
    ("No module named \u2018torch._six\u2019", "No module named 'torch._six'"),
    ("\u201cfp16\u201d: {\u201cenabled\u201d: true}", '"fp16": {"enabled": true}'),
    ("CUDA\u00a0out of\u202fmemory\u200b\u2026\nnext\u2011line \u22129",
     "CUDA out of memory...\nnext-line -9"),
], ids=["em-dash-option", "en-dash-options", "prose-dashes-kept", "curly-single",
        "curly-double", "spaces-invisible-ellipsis"])
def test_typographic_punctuation_is_made_plain(text: str, plain: str) -> None:
    """Rich text turns `--` before an option into an en or em dash, quotes curly, spaces
    no-break and `...` an ellipsis; doctor turns them back, line for line. A dash between
    words or numbers, after a path or before a space is prose and stays. Fails when a
    piece of the mapping is dropped, or when the dash rule rewrites prose dashes."""
    assert normalise_punctuation(text) == plain
    assert normalise_punctuation(text).count("\n") == text.count("\n")


@pytest.mark.parametrize(("text", "category", "signature"), [
    ("KeyError: \u2018LOCAL_RANK\u2019", "launcher-args", "no-launcher-environment"),
    ("usage: pretrain.py [-h] [--epochs EPOCHS]\npretrain.py: error: unrecognized arguments: "
     "\u2014local-rank=3", "launcher-args", "local-rank-unrecognized"),
    ("ValueError: Some specified arguments are not used by the HfArgumentParser: "
     "[\u2018\u2013local_rank=0\u2019]", "launcher-args", "local-rank-unrecognized"),
    ("RuntimeError: Error building extension \u2018fused_adam\u2019", "deepspeed-op-build",
     "ds-op-build-failed"),
    ("torch.OutOfMemoryError: CUDA\u00a0out of memory. Tried to allocate 2.00\u00a0GiB",
     "cuda-oom", "cuda-out-of-memory"),
], ids=["curly-key", "em-dash-local-rank", "hf-parser-quotes-dash", "curly-op-name",
        "no-break-spaces"])
def test_a_log_pasted_through_rich_text_reads_as_printed(text: str, category: str,
                                                         signature: str) -> None:
    """Each line needs its plain punctuation to match (a straight quote, `--local`, plain
    spaces are in the patterns), and what doctor quotes is still the line as posted. Fails
    when the punctuation is not made plain (the patterns or the literal prefilter see the
    typographic text: unknown, or the generic bad-arguments reading), or when the quoted
    line is the normalised one."""
    diagnosis = diagnose(text)
    assert (diagnosis.category, diagnosis.signature) == (category, signature)
    assert diagnosis.matches[-1].text == text.splitlines()[-1].strip()


@pytest.mark.parametrize(("text", "category"), [
    # Apex amp used where its try/except import failed (a NameError, or amp set to None)
    ("    with amp.scale_loss(loss, optimizer) as scaled_loss:\nNameError: name 'amp' is not "
     "defined. Did you mean: 'map'?", "apex-missing-or-wrong"),
    ("    model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)\n"
     "AttributeError: 'NoneType' object has no attribute 'initialize'",
     "apex-missing-or-wrong"),
    ("    model = apex.parallel.convert_syncbn_model(model)\nNameError: name 'apex' is not "
     "defined", "apex-missing-or-wrong"),
    ("    scaler = amp.GradScaler()\nNameError: name 'amp' is not defined", UNKNOWN),
    # Apex built without its extensions, in its optimizers' and helpers' words
    ("RuntimeError: apex.optimizers.FusedLAMB requires cuda extensions",
     "apex-missing-or-wrong"),
    ("RuntimeError: apex.contrib.optimizers.FusedSGD requires cuda extensions",
     "apex-missing-or-wrong"),
    ("RuntimeError: FP16_Optimizer requires cuda extensions", "apex-missing-or-wrong"),
    ("RuntimeError: ScaledMaskedSoftmax requires cuda extensions", UNKNOWN),
    ("RuntimeError: Attempted to call MultiTensorApply method, but MultiTensorApply is not "
     "available, possibly because Apex was installed without --cpp_ext --cuda_ext.",
     "apex-missing-or-wrong"),
    ("Warning:  apex was installed without --cuda_ext.  FusedLayerNorm will be unavailable.",
     "apex-missing-or-wrong"),
    ("apex was installed without --xentropy flag, contrib.xentropy is not available\n"
     "ModuleNotFoundError: No module named 'xentropy_cuda'", "apex-missing-or-wrong"),
    ("Warning:  apex was installed without --cpp_ext.  Falling back to Python flatten and "
     "unflatten.", BENIGN),
    ("Warning:  using Python fallback for SyncBatchNorm, possibly because apex was installed "
     "without --cuda_ext.  The exception raised when attempting to import the cuda backend "
     "was:  No module named 'syncbn'", BENIGN),
    ("Warning:  apex was installed without --cuda_ext. Fused syncbn kernels will be "
     "unavailable.  Python fallbacks will be used instead.", BENIGN),
    # DeepSpeed's checkpoint readers finding no ZeRO files where they look
    ("[rank0]: AssertionError: No ZeRO files found in /mnt/ckpt/step_500/", "zero-checkpoint"),
    ("FileNotFoundError: can't find ZeRO Stage 3 model state files in directory "
     "'/ckpt/global_step5'", "zero-checkpoint"),
    ("RuntimeError: Missing ZeRO-3 checkpoint file for tp_rank=0, dp_rank=3",
     "zero-checkpoint"),
    ("RuntimeError: ZeRO-3 checkpoint has no model/optimizer rank files", "zero-checkpoint"),
    # argparse's line as some wrappers (or users) capitalise it
    ("Error: unrecognized arguments: --nproc_per_node=8", "launcher-args"),
], ids=["amp-scale-loss-nameerror", "amp-none-initialize", "apex-nameerror",
        "torch-amp-nameerror", "apex-fused-lamb", "apex-contrib-sgd", "apex-fp16-optimizer",
        "colossal-softmax", "apex-multi-tensor", "apex-old-layer-norm", "apex-contrib-flag",
        "apex-flatten-fallback", "apex-syncbn-fallback", "apex-old-syncbn-fallback",
        "ds-no-zero-files", "ds-stage3-no-files", "ds-universal-missing", "ds-universal-none",
        "capital-error"])
def test_wordings_beyond_the_blind_logs(text: str, category: str) -> None:
    """Round 4's rules, each in other words than the blind log that showed it missing:
    Apex amp used after its import failed quietly (amp.scale_loss, amp set to None, the
    `apex` name itself), though torch.cuda.amp's NameError is not Apex's; every Apex
    optimizer's and helper's "requires cuda extensions" and "installed without" (not
    another project's kernel saying the same), while Apex's Python fallback notices stay
    harmless; the ZeRO checkpoint readers of conversion to Megatron, universal checkpoints
    and ZeRO-3 finding no files; argparse's error capitalised. Fails when a rule is
    removed, loses its context (torch amp or ColossalAI read as Apex) or keys on one log's
    words."""
    assert diagnose(text).category == category


# -- round 5: the wordings behind the blind2 misses, as other projects print them --------------

@pytest.mark.parametrize(("text", "category"), [
    # a loss scale halving, worded by other scalers (each line a step further down)
    ("".join(f"step {i}: NaN grads, decreasing loss_scale to {2.0 ** (8 - i)}\n"
             for i in range(12)), "fp16-overflow"),
    ("".join(f"Found inf, reduced the dynamic loss scale to {2.0 ** (10 - i)}\n"
             for i in range(14)), "fp16-overflow"),
    # improved-diffusion style log2 scale running negative
    ("".join(f"Found NaN, decreased lg_loss_scale to {19.0 - i}\n" for i in range(24)),
     "fp16-overflow"),
    # a DeepSpeed op's ninja build failing on an object file
    ("Emitting ninja build file /root/.cache/torch_extensions/py311_cu121/cpu_adam/"
     "build.ninja...\nFAILED: cpu_adam_impl.o \nc++ -MMD -MF cpu_adam_impl.o.d "
     "-DTORCH_EXTENSION_NAME=cpu_adam -c csrc/adam/cpu_adam_impl.cpp", "deepspeed-op-build"),
    ("    ds_engine = deepspeed.initialize(model=model)\n"
     "NameError: name 'deepspeed' is not defined", "deepspeed-missing"),
    ("ValueError: Precision.AMP_FP16 is not supported for CPU training.",
     "cuda-unavailable-or-mismatch"),
    ("RuntimeError: fp16 mixed precision is not supported on CPU", "cuda-unavailable-or-mismatch"),
    ("  Running setup.py install for horovod ... error\n"
     "ERROR: Command errored out with exit status 1: /usr/bin/python3 -u -c 'import sys'",
     "horovod-not-built"),
    ("  Building wheel for horovod (pyproject.toml) ... error\n  error: subprocess-exited-"
     "with-error", "horovod-not-built"),
    ("ImportError: No module named apex.parallel", "apex-missing-or-wrong"),
    ("allennlp.common.checks.ConfigurationError: You specified an apex_opt_level, but we "
     "could not import apex.", "apex-missing-or-wrong"),
    ("WARNING: Could not import NVIDIA apex, fused kernels are required", "apex-missing-or-wrong"),
    ("    assert cfg.batch_size % len(gpus) == 0\nAssertionError", "batch-size"),
    ("    assert opt.batch_size % opt.world_size == 0, '--batch-size must be multiple of "
     "CUDA device count'\nAssertionError", "batch-size"),
    ("AssertionError: only support equal chunk. Got size of DataProto 6 and chunk 4.",
     "batch-size"),
    ("[Rank 3] Watchdog caught collective opera\ntion timeout: WorkNCCL(SeqNum=7, "
     "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600042 milliseconds before tim\ning out.",
     "nccl-comm"),
], ids=["worded-decreasing", "worded-reduced-dynamic", "lg-loss-scale", "ds-ninja-failed",
        "ds-nameerror", "composer-amp-fp16-cpu", "fp16-on-cpu", "horovod-setup-install",
        "horovod-pyproject-wheel", "apex-py2-import", "allennlp-apex", "could-not-import-apex",
        "batch-assert-gpus", "batch-assert-world-size", "verl-equal-chunk",
        "watchdog-wrapped"])
def test_wordings_beyond_the_blind2_logs(text: str, category: str) -> None:
    """Round 5's rules, each in other words than the blind2 log that showed it missing: a
    loss scale halving said in words ("decreasing loss_scale to", "reduced the dynamic
    loss scale to") or as improved-diffusion's log2 scale running below 3; a DeepSpeed op's
    ninja build failing on an object file (DeepSpeed's op named in the build); DeepSpeed
    used after its import failed quietly; GPU mixed precision asked of a CPU run; a pip
    build of Horovod erroring (setup.py install, a pyproject wheel); Apex missing as
    Python 2 names the module and as allennlp and others say it; a script's own assert
    that the batch splits over the GPUs; verl's unequal chunk; an NCCL watchdog timeout
    hard-wrapped after "collective opera". Fails when a rule is removed or keys on one
    log's words."""
    assert diagnose(text).category == category


@pytest.mark.parametrize("text", [
    "".join(f"Found NaN, decreased lg_loss_scale to {20.0 - i}\n" for i in range(5)),
    "".join(f"decreasing loss scale to {2.0 ** (16 - i)}\n" for i in range(5)),
    "Building extension module fused_adam...\nAllowing ninja to set a default number of "
    "workers... (overridable by setting the environment variable MAX_JOBS=N)",
    "FAILED: upfirdn2d_kernel.cuda.o \n/usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME="
    "upfirdn2d -c upfirdn2d_kernel.cu",
    "Watchdog caught collective operation",
], ids=["lg-warm-up", "worded-warm-up", "ds-build-cut-short", "ninja-failed-not-ds",
        "watchdog-mid-line"])
def test_round5_rules_do_not_overreach(text: str) -> None:
    """What the round-5 rules must not claim: a log2 or worded loss scale that stops high
    (warm-up), a DeepSpeed build cut off before any error (building is no failure), a
    ninja FAILED object of another project's extension, a watchdog phrase that does not
    end its line (no wrap). Fails when a rule drops its floor, its DeepSpeed context or its
    end-of-line anchor."""
    assert diagnose(text).category in (BENIGN, UNKNOWN)


def test_library_notices_are_harmless() -> None:
    """A library saying Triton is not available (it skips optional kernels) and DDP warning
    that grad strides do not match its buckets ("This is not an error") are notices; a
    failure beside them still decides. Fails when either notice has no benign rule (the
    log would be unknown) or reads as a failure."""
    triton = "UserWarning: Triton is not available, some optimizations will not be enabled."
    strides = ("UserWarning: Grad strides do not match bucket view strides. This may "
               "indicate grad was not created according to the gradient layout contract")
    for notice in (triton, strides):
        assert diagnose(notice).category == BENIGN
        assert diagnose(notice + "\ntorch.OutOfMemoryError: CUDA out of memory.").category \
            == "cuda-oom"
    assert diagnose("INFO: triton is not installed; falling back to the eager kernels")\
        .category == BENIGN
    # "could not import apex" is Apex missing (round 5) unless the line says it carries on
    assert diagnose("Warning: could not import apex, falling back to torch LayerNorm")\
        .category == BENIGN
