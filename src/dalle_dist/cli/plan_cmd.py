"""`dalle-dist plan`: memory per GPU of a training run, for every backend, ZeRO stage and
precision, and which to use. Model flags are `train`'s, with its defaults.

--json prints one object (all sizes in bytes):
  version             1
  model               {"dalle": DALLEConfig dict, "vae": VAEConfig dict, or the VQGAN's
                      config dict (its "tokenizer" is "vqgan") with --vqgan_config_path}
  parameters          {"dalle": int, "vae": int}  (vae: the VAE's or the VQGAN's)
  sequence            {"text": int, "image": int, "length": int}  (length = text + image - 1)
  layers              [{"pattern": str, "path": str}]  (the attention path on --device)
  batch_size, gpus    the global batch and the GPUs it is split over
  gpu_memory_bytes    --gpu_memory; usable_bytes: the part a plan fills (90%)
  device              cuda or cpu: whose kernels the activations are counted for
  rows                [{backend, zero_stage (int | null), precision, gpus, micro_batch,
                        params, grads, optimizer, activations, buffers, peak, fits (bool),
                        max_batch (largest global batch that fits), items {name: bytes}}]
  recommendation      str
  checkpoints         [{format, layout, backends, save_root, save_other, resume,
                        resume_shared (bool: from a file mapped once per node), on_disk}]
                      host bytes a rank adds at a save and a resume (plan/checkpoints.py)
  attention_kernels   {"capability": str | null (this GPU's; "8.0" with "assumed": true
                      without one), "assumed", "attn_dropout", "patterns": {pattern:
                      {precision: {"path": str, "kernel": str}}}}  (model/kernels.py)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.config_base import JsonOutput, add_flags, flag_fields, from_args
from dalle_dist.data.config import DataConfig, TokenizerConfig
from dalle_dist.errors import ConfigError
from dalle_dist.model.config import ComputeConfig, DALLEConfig, VAEConfig
from dalle_dist.model.vqgan import VQGANConfig
from dalle_dist.plan.config import PlanConfig, SbatchConfig
from dalle_dist.train.config import DalleRun, EMAConfig, TrainConfig

#: the VAE flags that shape the DALL-E (the others only change how a VAE trains)
_VAE_SHAPE = ("image_size", "num_tokens", "num_layers", "num_resnet_blocks", "codebook_dim",
              "hidden_dim")


def add_plan(p: argparse.ArgumentParser) -> None:
    p.description = ("Estimate the memory per GPU of `dalle-dist train` with "
                     "these flags for every backend x ZeRO stage x precision, "
                     "and recommend one. Nothing is built or launched.")
    model = p.add_argument_group("model (as `train`)")
    add_flags(model, DalleRun, only=["dalle_path"], help={
        "dalle_path": "size the model of this DALL-E checkpoint (any of ours, an imported "
                      "one included; only its configs are read): its model, VAE or VQGAN "
                      "and vocabulary stand for the model, VAE and tokenizer flags"})
    add_flags(model, DALLEConfig)
    add_flags(model, PlanConfig, only=["num_text_tokens"])
    add_flags(model, TokenizerConfig,
              help={"bpe_path": "tokenizer file (as `train`): its vocabulary replaces "
                                "--num_text_tokens"})
    # TF32 changes no memory; plan sizes the eager step's activations (a compiled block's
    # graph chooses for itself what it keeps for backward), so --compile is no plan flag
    add_flags(model, ComputeConfig, exclude=["no_tf32", "compile", "compile_backend"])
    add_flags(p.add_argument_group("VAE and data (as `train-vae`)"), VAEConfig, only=_VAE_SHAPE)
    add_flags(p.add_argument_group("VQGAN image tokenizer (as `train`), instead of a VAE"),
              TamingConfig, help={
                  "taming": "size a taming-transformers VQGAN instead of a VAE; needs "
                            "--vqgan_config_path",
                  "vqgan_model_path": "the VQGAN's checkpoint, as `train` takes it (optional "
                                      "here: plan reads no weights)",
                  "vqgan_config_path": "the VQGAN's model.yaml: its ddconfig, embed_dim and "
                                       "n_embed give the image size, the tokens and the "
                                       "parameters (frozen weights + encode activations)"})
    add_flags(p.add_argument_group("data (as `train`)"), DataConfig, only=["token_shards"],
              help={"token_shards": "train from token shards: the step runs no encoder, so "
                                    "no encode activations are counted (plan reads nothing "
                                    "from DIR)"})
    plan = p.add_argument_group("plan")
    add_flags(plan, TrainConfig, only=["batch_size"],
              help={"batch_size": "global batch, split over the GPUs"})
    add_flags(p, EMAConfig, only=["ema_decay"],
              help={"ema_decay": "count train --ema_decay's fp32 average of the weights "
                                 "(sharded where the weights are); its value changes "
                                 "nothing else"})
    add_flags(plan, PlanConfig, exclude=["num_text_tokens"])
    add_flags(p, SbatchConfig)
    add_flags(plan, JsonOutput,
              help={"json": "print one JSON object (its schema: docs/diagnose.md)"})
    p.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from dalle_dist import plan
    from dalle_dist.plan.vqgan import stand_in_vae, with_vqgan

    sbatch = from_args(SbatchConfig, args)
    if sbatch.sbatch:
        _sbatch_gpus(args, sbatch)
    dalle_cfg, vae_cfg, vqgan = _configs(args)
    precisions = (plan.PRECISIONS if args.precisions is None else
                  tuple(x.strip() for x in args.precisions.split(",") if x.strip()))
    if not precisions:
        raise ConfigError("--precision is empty", f"give some of {', '.join(plan.PRECISIONS)}")
    memory = plan.parse_memory(args.gpu_memory)
    stand_in = vae_cfg if vqgan is None else stand_in_vae(vqgan)
    rows = plan.estimate(dalle_cfg, args.batch_size, args.gpus, vae=stand_in,
                         precisions=precisions, device=args.device, attn_impl=args.attn_impl,
                         activation_checkpointing=args.activation_checkpointing,
                         token_shards=bool(args.token_shards),
                         ema=args.ema_decay is not None)
    if vqgan is not None:
        rows = with_vqgan(rows, vqgan, stand_in, args.device, encodes=not args.token_shards)
    advice = plan.recommend(rows, memory)
    if sbatch.sbatch:
        print(_sbatch_script(rows, args, sbatch, memory, advice))
        return 0
    report = _report(dalle_cfg, vqgan or vae_cfg, rows, args, memory, advice)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_human(report))
    return 0


#: plan flags that are not train's, or that the script writes itself
_NOT_TRAIN = {"batch_size", "precisions", "device", "gpus", "gpu_memory", "json",
              "num_text_tokens", "dalle_path", *(f.name for f in flag_fields(SbatchConfig))}


def _sbatch_gpus(args: argparse.Namespace, sbatch: SbatchConfig) -> None:
    """--sbatch plans for --nodes x --gpus_per_node GPUs (a --gpus that says otherwise is
    refused) and for a new run (not --dalle_path's checkpoint)."""
    sbatch.validate()
    if args.dalle_path:
        raise ConfigError("--sbatch writes a new run's script, and --dalle_path sizes a "
                          "checkpoint", "give the model flags instead of --dalle_path")
    gpus = sbatch.nodes * sbatch.gpus_per_node
    if "gpus" in args.given and args.gpus != gpus:
        raise ConfigError(f"--gpus {args.gpus} but --nodes {sbatch.nodes} x --gpus_per_node "
                          f"{sbatch.gpus_per_node} = {gpus}", "drop --gpus with --sbatch")
    args.gpus = gpus


def _train_flags(args: argparse.Namespace) -> list[str]:
    """The flags given to plan that `train` takes too, written as train's."""
    from dalle_dist.cli import build_parser
    from dalle_dist.cli.parser import subcommand_parser

    plan = subcommand_parser(build_parser(["plan"]), "plan")
    train = subcommand_parser(build_parser(["train"]), "train")
    assert plan is not None and train is not None
    train_actions = {a.dest: a for a in train._actions if a.option_strings}
    flags: list[str] = []
    for action in plan._actions:
        dest = action.dest
        target = train_actions.get(dest)
        if dest not in args.given or dest in _NOT_TRAIN or target is None:
            continue
        value = getattr(args, dest)
        if isinstance(target, argparse._StoreTrueAction):
            flags += [target.option_strings[0]] if value else []
        elif value is not None:
            shown = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else value
            flags += [target.option_strings[0], str(shown)]
    return flags


def _sbatch_script(rows: list, args: argparse.Namespace, sbatch: SbatchConfig, memory: int,
                   advice: str) -> str:
    """The script for the row the recommendation leads with (plan/sbatch.py), or the
    recommendation itself as the error when no row takes the batch."""
    import shlex
    import sys

    from dalle_dist import plan
    from dalle_dist.plan.sbatch import SbatchJob, chosen_row, script

    row = chosen_row(rows, args.batch_size, args.gpus, int(memory * plan.USABLE_FRACTION))
    if row is None:
        raise ConfigError(f"no backend takes batch {args.batch_size} on {args.gpus} GPU(s): "
                          f"{advice}", "lower --batch_size, or add --nodes / --gpus_per_node")
    job = SbatchJob(sbatch.nodes, sbatch.gpus_per_node, args.device == "cuda",
                    sbatch.signal_margin, sbatch.time, sbatch.partition, sbatch.job_name,
                    sys.executable)
    plan_line = "dalle-dist plan " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["plan"]
                                                else sys.argv[1:])
    return script(row, job, _train_flags(args), args.batch_size, sbatch.output, plan_line)


def _configs(args: argparse.Namespace) -> tuple[DALLEConfig, VAEConfig, VQGANConfig | None]:
    """The DALL-E, the VAE flags' config, and the VQGAN (None: no --taming / --vqgan_*),
    which then sets the image tokens in place of the VAE flags."""
    from dalle_dist.model import PatternOptions, build_pattern
    from dalle_dist.plan.vqgan import read_plan_vqgan

    if args.dalle_path:
        return _checkpoint_configs(args)
    vocab = args.num_text_tokens
    tokenizer = from_args(TokenizerConfig, args)
    if tokenizer.given:
        from dalle_dist.data.tokenizer import load_tokenizer

        vocab = load_tokenizer(tokenizer).vocab_size
    if vocab <= 1:
        raise ConfigError(f"--num_text_tokens must be at least 2, got {vocab}")
    vae = from_args(VAEConfig, args)
    vae.validate()
    vqgan = read_plan_vqgan(args.taming, args.vqgan_model_path, args.vqgan_config_path)
    image: VAEConfig | VQGANConfig = vae
    if vqgan is not None:
        defaults = VAEConfig()
        given = [f"--{name}" for name in _VAE_SHAPE
                 if getattr(vae, name) != getattr(defaults, name)]
        if given:
            raise ConfigError(f"{', '.join(given)} and --vqgan_config_path both shape the "
                              "image tokens", f"drop {', '.join(given)}: the VQGAN's config "
                              "sets the image size and the tokens")
        image = vqgan
    dalle = from_args(DALLEConfig, args, num_text_tokens=vocab,
                      num_image_tokens=image.num_tokens, image_fmap_size=image.fmap_size)
    dalle.validate()
    options = PatternOptions(dalle.conv_kernel_size, dalle.conv_dilation,
                             dalle.sparse_random_blocks)
    for name in dalle.attn_types:
        build_pattern(name, options)  # unknown names and bad pattern knobs are ConfigErrors
    return dalle, vae, vqgan


def _checkpoint_configs(args: argparse.Namespace
                        ) -> tuple[DALLEConfig, VAEConfig, VQGANConfig | None]:
    """_configs for --dalle_path: the checkpoint's own configs (no weights are read). A
    model, VAE or tokenizer flag given beside it is refused: one of the two would be
    ignored."""
    from dalle_dist.checkpoint.load import load_checkpoint
    from dalle_dist.model.image_tokenizer import is_vqgan_config

    shaped = [*(f.name for f in flag_fields(DALLEConfig)), *_VAE_SHAPE, "num_text_tokens",
              "bpe_path", "hug", "chinese", "taming", "vqgan_model_path", "vqgan_config_path"]
    parser = argparse.ArgumentParser(add_help=False)
    add_plan(parser)
    defaults = parser.parse_args([])
    given = [f"--{name}" for name in shaped
             if hasattr(args, name) and getattr(args, name) != getattr(defaults, name)]
    if given:
        raise ConfigError(f"{given[0]} and --dalle_path both set the model",
                          "drop one: --dalle_path sizes the checkpoint's own model")
    payload = load_checkpoint(args.dalle_path, "--dalle_path", "dalle", keep_ds_dir=True,
                              keep_sharded=True)
    configs = payload["configs"]
    dalle = DALLEConfig.from_dict(configs["model"])
    if is_vqgan_config(configs["vae"]):
        return dalle, VAEConfig(), VQGANConfig.from_dict(configs["vae"])
    return dalle, VAEConfig.from_dict(configs["vae"]), None


def _report(dalle_cfg: object, vae_cfg: VAEConfig | VQGANConfig, rows: list,
            args: argparse.Namespace, memory: int, advice: str) -> dict:
    from dalle_dist import plan
    from dalle_dist.plan.advice import attention_kernels
    from dalle_dist.plan.checkpoints import checkpoint_rows
    from dalle_dist.plan.parameters import dalle_parameter_shapes, numel

    budget = int(memory * plan.USABLE_FRACTION)
    c = dalle_cfg
    layers = plan.layer_paths(c, args.device, args.attn_impl)
    return {
        "version": 1,
        "model": {"dalle": c.to_dict(), "vae": vae_cfg.to_dict()},
        "parameters": {"dalle": plan.dalle_parameters(c), "vae": _tokenizer_parameters(vae_cfg)},
        "sequence": {"text": c.text_seq_len + 1, "image": c.image_seq_len,
                     "length": c.text_seq_len + c.image_seq_len},
        "layers": [{"pattern": pattern, "path": path} for pattern, path in layers],
        "batch_size": args.batch_size, "gpus": args.gpus, "gpu_memory_bytes": memory,
        "usable_bytes": budget, "device": args.device,
        "activation_checkpointing": args.activation_checkpointing,
        "token_shards": bool(args.token_shards),
        "ema": args.ema_decay is not None,
        "rows": [{"backend": r.backend, "zero_stage": r.zero_stage, "precision": r.precision,
                  "gpus": r.gpus, "micro_batch": r.micro_batch, "params": r.params,
                  "grads": r.grads, "optimizer": r.optimizer, "activations": r.activations,
                  "buffers": r.buffers, "peak": r.peak, "fits": r.peak <= budget,
                  "max_batch": r.max_batch(budget), "items": r.items} for r in rows],
        "recommendation": advice,
        "checkpoints": [asdict(row) for row in checkpoint_rows(
            plan.dalle_parameters(c), _tokenizer_parameters(vae_cfg), args.gpus,
            max(numel((shape,)) for shape in dalle_parameter_shapes(c).values()))],
        "attention_kernels": attention_kernels(
            c, args.device, args.attn_impl, tuple(dict.fromkeys(r.precision for r in rows))),
    }


def _tokenizer_parameters(vae_cfg: VAEConfig | VQGANConfig) -> int:
    from dalle_dist import plan
    from dalle_dist.plan.vqgan import vqgan_parameters

    return (vqgan_parameters(vae_cfg) if isinstance(vae_cfg, VQGANConfig)
            else plan.vae_parameters(vae_cfg))


def _checkpoint_lines(report: dict) -> list[str]:
    from dalle_dist.plan import format_bytes

    rows = [("checkpoint format", "writes", "save: rank 0", "other ranks", "resume: each rank",
             "on disk")]
    for r in report["checkpoints"]:
        shared = " (mapped, shared per node)" if r["resume_shared"] else ""
        rows.append((r["format"], r["layout"], format_bytes(r["save_root"]),
                     format_bytes(r["save_other"]), format_bytes(r["resume"]) + shared,
                     format_bytes(r["on_disk"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["", f"host memory a rank adds to save and resume, on {report['gpus']} rank(s) "
                 "(weights and Adam's moments in fp32, and the VAE):"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return lines


def _human(report: dict) -> str:
    from dalle_dist.model.image_tokenizer import is_vqgan_config
    from dalle_dist.plan import format_bytes
    from dalle_dist.plan.advice import kernel_lines

    seq = report["sequence"]
    counts: dict[str, int] = {}
    for layer in report["layers"]:
        key = f"{layer['pattern']} ({layer['path']})"
        counts[key] = counts.get(key, 0) + 1
    tokenizer = "VQGAN" if is_vqgan_config(report["model"]["vae"]) else "VAE"
    lines = [
        f"DALL-E {report['parameters']['dalle'] / 1e6:.2f}M parameters, {tokenizer} "
        f"{report['parameters']['vae'] / 1e6:.2f}M (frozen); sequence {seq['length']} = "
        f"{seq['text']} text + {seq['image']} image - 1; layers: "
        + ", ".join(f"{n} x {k}" for k, n in counts.items()) + f" on {report['device']}"
        + (", each checkpointed" if report["activation_checkpointing"] else "")
        + (", with an EMA of the weights" if report["ema"] else ""),
        f"global batch {report['batch_size']} on {report['gpus']} GPU(s) of "
        f"{format_bytes(report['gpu_memory_bytes'], si=True)} "
        f"({format_bytes(report['gpu_memory_bytes'])}; a plan fills "
        f"{format_bytes(report['usable_bytes'])})",
        "",
    ]
    header = ("backend", "precision", "batch/GPU", "params", "grads", "optimizer",
              "activations", "buffers", "peak", "fits", "max batch")
    table = [header]
    for r in report["rows"]:
        label = (r["backend"] if r["zero_stage"] is None
                 else f"{r['backend']} ZeRO-{r['zero_stage']}")
        table.append((label, r["precision"], str(r["micro_batch"]),
                      *(format_bytes(r[k]) for k in ("params", "grads", "optimizer",
                                                     "activations", "buffers", "peak")),
                      "yes" if r["fits"] else "no", str(r["max_batch"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [cell.ljust(w) if i < 2 else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines += ["", "columns: each part's own maximum; peak: the modelled high-water mark "
                  "(below their sum: gradients fill as activations are freed).",
              "max batch: the largest global batch that fits; horovod's --batch_size is "
              "per worker (batch/GPU)."]
    lines += kernel_lines(report["attention_kernels"])
    lines += _checkpoint_lines(report)
    lines.append(f"recommendation: {report['recommendation']}")  # last: what most read
    return "\n".join(lines)
