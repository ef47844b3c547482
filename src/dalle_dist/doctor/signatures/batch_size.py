"""Batches that do not split over the ranks and gradient accumulation, or data smaller than
one batch (batch-size). Ranks 1000s.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import Signature

SIGNATURES: tuple[Signature, ...] = (
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
        "grep -n batch_size YOUR_DS_CONFIG.json",
        priority=1000),
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
        "ls DATASET | wc -l",
        priority=1005),
)
