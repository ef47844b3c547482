"""Host memory a rank adds to save and to resume, per checkpoint format: `plan`'s
checkpoint rows (docs/checkpoints.md says what each format writes).

S = the training state, 12 bytes a DALL-E parameter (fp32 weights 4, Adam's two moments 8,
in every precision: autocast keeps fp32 masters), plus the frozen VAE's fp32 weights that
every checkpoint carries (V). N = ranks. T = the largest single tensor of the state.

  full (NAME.pt)        save: rank 0 gathers the whole state on the host (S + V); the
                        other ranks add nothing. resume: every rank maps the file: the
                        page cache holds S + V once per node, shared by its ranks
                        (checkpoint/format.py), and each rank copies out what it keeps.
  sharded (NAME-sharded/)  save: each rank writes its own shards (S / N) straight from the
                        tensors, copying one tensor at a time to the host (T); with
                        --async_checkpoint it first copies all of them (S / N) and
                        writes those in the background. resume: each rank reads its own
                        slices (S / N), one tensor at a time (T).
  deepspeed (NAME-ds-cp/)  save: each rank's partition (S / N for ZeRO 1-3) is serialised
                        through the host; NAME.pt (at the first save, a stop and the end)
                        gathers the 4-byte weights on rank 0 (4 P). resume: each rank
                        loads its partition files whole (S / N).
"""

from __future__ import annotations

from dataclasses import dataclass

#: bytes per DALL-E parameter in a checkpoint: fp32 weights and Adam's two fp32 moments
STATE_BYTES_PER_PARAMETER = 12


@dataclass(frozen=True)
class CheckpointRow:
    """One format: what a rank adds to its host memory at a save and at a resume."""

    format: str  # --checkpoint_format (deepspeed: its own directory)
    layout: str  # what it writes
    backends: str  # which backends write it (by default, or on request)
    save_root: int  # bytes rank 0 adds during a save
    save_other: int  # bytes each other rank adds during a save
    resume: int  # bytes each rank reads at a resume
    resume_shared: bool  # ... from a file mapped once per node (the page cache's, shared)
    on_disk: int  # bytes of one save, all ranks together


def checkpoint_rows(dalle_params: int, vae_params: int, ranks: int,
                    largest_tensor: int) -> list[CheckpointRow]:
    """The rows for a model of `dalle_params` (largest tensor: `largest_tensor` elements)
    trained on `ranks` ranks; see the module docstring for the formulas."""
    state = STATE_BYTES_PER_PARAMETER * dalle_params
    vae = 4 * vae_params
    shard = -(-state // ranks)
    one_tensor = 4 * largest_tensor
    return [
        CheckpointRow("full", "NAME.pt", "single, torch, horovod (default); fsdp",
                      save_root=state + vae, save_other=0, resume=state + vae,
                      resume_shared=True, on_disk=state + vae),
        CheckpointRow("sharded", "NAME-sharded/", "fsdp (default); single, torch",
                      save_root=min(one_tensor, shard) + vae, save_other=min(one_tensor, shard),
                      resume=min(one_tensor, shard), resume_shared=False, on_disk=state + vae),
        CheckpointRow("sharded, --async_checkpoint", "NAME-sharded/", "fsdp, single, torch",
                      save_root=shard + vae, save_other=shard, resume=min(one_tensor, shard),
                      resume_shared=False, on_disk=state + vae),
        CheckpointRow("deepspeed", "NAME-ds-cp/ (+ NAME.pt at the ends)", "deepspeed",
                      save_root=shard + 4 * dalle_params + vae, save_other=shard,
                      resume=shard, resume_shared=False, on_disk=state + 4 * dalle_params + vae),
    ]
