"""Every flag of DALLE-pytorch's final scripts is a flag of ours, on the matching command.

The lists are DALLE-pytorch's own (lucidrains/DALLE-pytorch at 58c1e1a, its last commit:
the `add_argument` calls of train_dalle.py, train_vae.py and generate.py, plus what its
`distributed_utils.wrap_arg_parser` adds to train_dalle.py). A user carries their command
line over; argparse's "unrecognized arguments" for one of these is the bug this catches
(issue 14 counted 23 such flags). Read from `--help`, so a flag hidden from the help
(argparse.SUPPRESS) fails too: the README promises each is documented.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

TRAIN_DALLE = """--vae_path --dalle_path --vqgan_model_path --vqgan_config_path --image_text_folder
--wds --truncate_captions --random_resize_crop_lower_ratio --chinese --taming --hug --bpe_path
--dalle_output_file_name --amp --wandb_name --wandb_entity --stable_softmax --flops_profiler
--epochs --save_every_n_steps --keep_n_checkpoints --batch_size --ga_steps --learning_rate
--clip_grad_norm --lr_decay --dim --text_seq_len --depth --heads --dim_head --ff_dropout
--attn_dropout --reversible --loss_img_weight --attn_types --shift_tokens --rotary_emb
--shared_attn_ids --shared_ff_ids --share_input_output_emb""".split()
TRAIN_VAE = """--image_folder --image_size --epochs --batch_size --learning_rate --lr_decay_rate
--starting_temp --temp_min --anneal_rate --num_images_save --num_tokens --num_layers
--num_resnet_blocks --emb_dim --hidden_dim --kl_loss_weight --transparent""".split()
GENERATE = """--dalle_path --vqgan_model_path --vqgan_config_path --text --num_images
--batch_size --top_k --outputs_dir --bpe_path --hug --chinese --taming --gentxt""".split()
#: distributed_utils.wrap_arg_parser and its DeepSpeed backend (deepspeed's own
#: add_config_arguments); --fp16 is how its users asked DeepSpeed for fp16.
DISTRIBUTED = ["--distributed_backend", "--distr_backend", "--deepspeed", "--deepspeed_config",
               "--fp16"]


def test_the_lists_are_dalle_pytorchs() -> None:
    """41 + 17 + 13 flags, none listed twice (a typo in the lists would hide a flag)."""
    assert (len(TRAIN_DALLE), len(TRAIN_VAE), len(GENERATE)) == (41, 17, 13)
    for flags in (TRAIN_DALLE, TRAIN_VAE, GENERATE):
        assert len(set(flags)) == len(flags)


def _help(command: str) -> set[str]:
    wide = {**os.environ, "COLUMNS": "10000"}
    done = subprocess.run([sys.executable, "-m", "dalle_dist", command, "--help"],
                          capture_output=True, text=True, timeout=120, check=True, env=wide)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_]*", done.stdout))


@pytest.mark.parametrize(("command", "flags"), [
    ("train", TRAIN_DALLE + DISTRIBUTED), ("train-vae", TRAIN_VAE), ("generate", GENERATE)])
def test_every_dalle_pytorch_flag_is_in_the_help(command: str, flags: list[str]) -> None:
    shown = _help(command)
    missing = [flag for flag in flags if flag not in shown]
    assert not missing, f"dalle-dist {command} lacks DALLE-pytorch's {' '.join(missing)}"
