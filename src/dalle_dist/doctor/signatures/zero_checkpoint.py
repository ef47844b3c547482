"""DeepSpeed ZeRO checkpoints that are incomplete or were saved by another number of ranks
(zero-checkpoint). Ranks 900s.
"""

from __future__ import annotations

from dalle_dist.doctor.signatures.base import Signature

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "zero-world-size-changed", "zero-checkpoint",
        (r"The checkpoint being loaded used a DP world size of (?P<saved>\d+) but the "
         r"current world size is (?P<now>\d+)",
         r"holds ZeRO-\d partitions of (?P<saved>\d+) ranks, this run has (?P<now>\d+)"),
        "the ZeRO checkpoint was saved by {saved} ranks and this run has {now}: ZeRO's "
        "optimizer partitions cannot be re-split on load",
        "resume with {saved} ranks, or consolidate it first: "
        "dalle-dist checkpoint convert NAME-ds-cp/ NAME.pt (weights only, fresh optimizer)",
        "ls NAME-ds-cp/$(cat NAME-ds-cp/latest) | grep -c optim_states",
        priority=900),
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
        "ls NAME-ds-cp/*/ | grep -c optim_states",
        priority=905),
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
        "cat NAME-ds-cp/latest; ls NAME-ds-cp/*/",
        priority=910),
)
