"""Flags come from the config dataclasses: one default per field, whatever the command.

Bugs these catch: a command declaring a model flag by hand with its own default (plan said
dim 128 while DALLEConfig said 256); a flag written twice in src/; a parser that loses a
field's DALLE-pytorch spelling; `plan` reporting a model other than the one `train` builds.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dalle_dist.backends.config import DistributedConfig
from dalle_dist.cli import build_parser
from dalle_dist.cli.parser import subcommand_parser
from dalle_dist.config_base import JsonOutput, flag_fields, flag_of
from dalle_dist.data.config import DataConfig, TokenizerConfig
from dalle_dist.generate import GenerateConfig, PromptsConfig
from dalle_dist.model.config import ComputeConfig, DALLEConfig, VAEConfig
from dalle_dist.plan.config import PlanConfig
from dalle_dist.selftest.config import SelftestConfig
from dalle_dist.train.config import (
    VAE_TRAIN_DEFAULTS,
    DalleRun,
    ResumeConfig,
    TrainConfig,
    VAERun,
    VAESamples,
    VAESchedule,
    ValidationConfig,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "dalle_dist"
CONFIGS = (DALLEConfig, VAEConfig, ComputeConfig, DataConfig, TokenizerConfig, TrainConfig,
           VAESchedule, VAESamples, ResumeConfig, GenerateConfig, DistributedConfig, DalleRun,
           VAERun, PromptsConfig, PlanConfig, JsonOutput, SelftestConfig)


def _cli(*argv: str) -> str:
    wide = {**os.environ, "COLUMNS": "10000"}  # help text unwrapped: one line per flag
    done = subprocess.run([sys.executable, "-m", "dalle_dist", *argv], capture_output=True,
                          text=True, timeout=120, check=True, env=wide)
    return done.stdout


def _help_defaults(text: str) -> dict[str, str]:
    """--flag -> the value its help shows as "(default X)" or "default X", from --help text
    ("default: ..." describes a default in words and is skipped)."""
    entries: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("  -"):
            entries.append([line.strip()])
        elif entries and line.startswith("    "):
            entries[-1].append(line.strip())
    shown: dict[str, str] = {}
    for entry in entries:
        joined = " | ".join(entry)  # help starts after two spaces or on the next line
        found = re.search(r"(?:\(|\| |  )default ([^\s),;:]+)", joined)
        if found:
            shown[joined.split()[0].rstrip(",")] = found.group(1)
    return shown


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def test_plan_reports_the_defaults_train_help_shows() -> None:
    """`plan --json` builds the default model; `train --help` shows the same numbers."""
    report = json.loads(_cli("plan", "--json"))
    train_help = _help_defaults(_cli("train", "--help"))
    vae_help = _help_defaults(_cli("train-vae", "--help"))
    checked = 0
    for cls, model, shown in ((DALLEConfig, report["model"]["dalle"], train_help),
                              (VAEConfig, report["model"]["vae"], vae_help)):
        for field in flag_fields(cls):
            option = flag_of(field).option_strings(field.name)[0]
            value = model[field.name]
            value = tuple(value) if isinstance(value, list) else value
            if option in shown:  # None defaults are described in words, not shown as values
                assert shown[option] == _shown(value), (option, shown[option], value)
                checked += 1
            assert value == field.default, (field.name, value, field.default)
    assert checked >= 20
    assert train_help["--dim"] == "128" and train_help["--dim_head"] == "32"


#: the configs whose fields each command's flags fill
USES = {"train": (DALLEConfig, ComputeConfig, DataConfig, TokenizerConfig, TrainConfig,
                  ResumeConfig, VAEConfig, DistributedConfig, ValidationConfig),
        "train-vae": (VAEConfig, VAESchedule, VAESamples, DataConfig, ResumeConfig,
                      DistributedConfig, ValidationConfig),
        "plan": (DALLEConfig, ComputeConfig, TokenizerConfig, VAEConfig, TrainConfig),
        "generate": (GenerateConfig, TokenizerConfig, DistributedConfig)}


def test_every_command_parses_a_shared_field_to_the_dataclass_default() -> None:
    parser = build_parser()
    seen: dict[str, set[str]] = {}
    for name, classes in USES.items():
        sub = subcommand_parser(parser, name)
        assert sub is not None
        defaults = vars(sub.parse_args([] if name != "generate" else
                                       ["--dalle_path", "d.pt", "--text", "t"]))
        for cls in classes:
            for field in flag_fields(cls):
                if field.name not in defaults:
                    continue
                assert defaults[field.name] == field.default, (name, field.name)
                seen.setdefault(field.name, set()).add(name)
    shared = {field for field, names in seen.items() if len(names) > 1}
    assert {"dim", "depth", "heads", "dim_head", "image_size", "num_tokens", "codebook_dim",
            "attn_impl", "bpe_path", "batch_size", "device", "zero_stage", "precision",
            "val_fraction", "val_every_n_steps"} <= shared
    vae = subcommand_parser(parser, "train-vae").parse_args([])
    assert (vae.epochs, vae.learning_rate) == (VAE_TRAIN_DEFAULTS.epochs,
                                               VAE_TRAIN_DEFAULTS.learning_rate)
    assert not hasattr(vae, "clip_grad_norm")  # DALLE-pytorch's train_vae.py clips nothing


def test_dalle_pytorch_spellings_still_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["train-vae", "--image_folder", "imgs", "--emb_dim", "32",
                              "--random_resize_crop_lower_ratio", "0.5"])
    assert (args.image_text_folder, args.codebook_dim, args.resize_ratio) == ("imgs", 32, 0.5)
    args = parser.parse_args(["train", "--attn_types", "full, axial_row", "--clip_grad_norm",
                              "none", "--sparse_random_blocks", "3"])
    assert args.attn_types == ("full", "axial_row")
    assert args.clip_grad_norm is None and args.sparse_random_blocks == 3
    args = parser.parse_args(["train", "--distr_backend", "deepspeed", "--fp16",
                              "--zero_stage", "2"])
    assert (args.backend, args.precision, args.zero_stage) == ("deepspeed", "fp16", 2)
    args = parser.parse_args(["train-vae", "--transparent", "--num_images_save", "4"])
    assert (args.channels, args.num_images_save) == (4, 4)
    args = parser.parse_args(["train", "--hug", "--bpe_path", "t.json", "--chinese"])
    assert (args.hug, args.bpe_path, args.chinese) == (True, "t.json", True)
    args = parser.parse_args(["generate", "--dalle_path", "d.pt", "--text", "t", "--gentxt",
                              "--hug", "--bpe_path", "t.json", "--chinese"])
    assert (args.gentxt, args.hug, args.bpe_path, args.chinese) == (True, True, "t.json", True)


def _declared_option_strings() -> list[tuple[str, str]]:
    """Every "--flag" literal passed to add_argument anywhere in src/."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        found.append((arg.value, str(path.relative_to(SRC))))
    return found


#: same spelling, another meaning: these judge or compare instead of configuring a run
OTHER_MEANING = {("--precision", "cli/check_cmd.py")}  # the one to judge; None: not asked


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_config_flags_are_declared_only_on_their_dataclass(cls: type) -> None:
    by_hand = [found for found in _declared_option_strings() if found not in OTHER_MEANING]
    for field in flag_fields(cls):
        for option in flag_of(field).option_strings(field.name):
            again = [path for declared, path in by_hand if declared == option]
            assert not again, f"{option} declared again in {again}"


def test_local_rank_is_declared_once() -> None:
    """The launchers' --local_rank has one declaration (cli/parser.add_launcher_rank) that
    the CLI and the selftest's worker share; a second copy drifted once (another default)."""
    where = [path for option, path in _declared_option_strings() if option == "--local_rank"]
    assert where == ["cli/parser.py"], where


def test_reversible_is_activation_checkpointing_and_shared_ids_parse() -> None:
    """--reversible (DALLE-pytorch) and --activation_checkpointing set one field, on train
    and plan; shared ids are DALLE-pytorch's comma strings."""
    parser = build_parser()
    for command in ("train", "plan"):
        for flag in ("--reversible", "--activation_checkpointing"):
            assert parser.parse_args([command, flag]).activation_checkpointing
        assert not parser.parse_args([command]).activation_checkpointing
    args = parser.parse_args(["train", "--shared_attn_ids", "0, 0,1", "--shared_ff_ids", "a,b,a",
                              "--share_input_output_emb"])
    assert (args.shared_attn_ids, args.shared_ff_ids) == (("0", "0", "1"), ("a", "b", "a"))
    assert args.share_input_output_emb
    assert parser.parse_args(["train"]).shared_attn_ids is None
    text = subcommand_parser(parser, "train").format_help()
    assert "--reversibleisDALLE-pytorch'sspelling;itmapstothis" in "".join(text.split())
