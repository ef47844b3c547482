"""Flags of `checkpoint inspect | convert | verify | export` (logic: dalle_dist.checkpoint.tools).

checkpoint.tools imports torch and the models: it is imported inside each command, so
`dalle-dist --help` stays cheap.
"""

from __future__ import annotations

import argparse
import json

from dalle_dist.checkpoint.taming import TamingConfig
from dalle_dist.config_base import JsonOutput, add_flags, from_args
from dalle_dist.data.config import TokenizerConfig

#: `export --weights` (checkpoint.tools.choose_weights; spelled here: that module imports torch)
WEIGHT_CHOICES = ("auto", "ema", "trained")


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.description = ("Tools for dalle_dist checkpoints: a single NAME.pt file, a sharded "
                     "NAME-sharded/ directory or a DeepSpeed NAME-ds-cp/ directory.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    q = actions.add_parser("inspect", help="what a checkpoint holds, without reading weights",
                           description="Print kind, configs, step, backend, sizes and "
                                       "parameter counts. Weights are not read.")
    q.add_argument("path", metavar="PATH", help="NAME.pt, NAME-sharded/ or NAME-ds-cp/")
    add_flags(q, JsonOutput)
    q.set_defaults(run=run_inspect)

    q = actions.add_parser("convert", help="a directory -> single file, or a file -> sharded",
                           description="Turn the newest save of a sharded directory into one "
                                       ".pt file (fp32 weights and the optimizer state), or "
                                       "the newest tag of a DeepSpeed directory (any ZeRO "
                                       "stage; needs DeepSpeed installed) into one with fp32 "
                                       "weights and no optimizer state; or a single file into "
                                       "a sharded directory, which any number of ranks "
                                       "resumes.")
    q.add_argument("source", metavar="SOURCE",
                   help="NAME-sharded/ or NAME-ds-cp/ written by a run, or a NAME.pt file")
    q.add_argument("out", metavar="OUT", help="the .pt file, or the sharded directory, to write")
    q.add_argument("--to", choices=("file", "sharded"), default=None,
                   help="what to write (default: sharded from a file, a file from a "
                        "directory)")
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q.set_defaults(run=run_convert)

    q = actions.add_parser("verify", help="check weights against the configs",
                           description="Load a checkpoint, check every weight's name and "
                                       "shape against the model its config describes (and "
                                       "the VAE a DALL-E carries) and that all values are "
                                       "finite. Exit 0 with 'ok: ...', else 2.")
    q.add_argument("path", metavar="PATH", help="NAME.pt, NAME-sharded/ or NAME-ds-cp/")
    q.set_defaults(run=run_verify)

    q = actions.add_parser("export", help="inference weights as safetensors + JSON config, "
                           "or a DALLE-pytorch .pt",
                           description="Write OUT.safetensors (keys prefixed 'dalle.' and "
                                       "'vae.') and OUT.json (configs, step, version); or, "
                                       "with --format dalle-pytorch, OUT as the dalle.pt "
                                       "(vae.pt for a VAE) DALLE-pytorch 1.6.6's generate.py "
                                       "(train_dalle.py --vae_path) loads, weights only.")
    q.add_argument("path", metavar="PATH", help="NAME.pt, NAME-sharded/ or NAME-ds-cp/")
    q.add_argument("out", metavar="OUT", help="output name; .safetensors and .json are "
                   "added (safetensors), or the .pt file to write (dalle-pytorch)")
    q.add_argument("--format", dest="export_format", choices=("safetensors", "dalle-pytorch"),
                   default="safetensors", help="what to write (default safetensors)")
    q.add_argument("--safetensors", action="store_true", default=True,
                   help="the same as --format safetensors (the default)")
    q.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto",
                   help="which weights of a DALL-E to write: ema (train --ema_decay's "
                   "average), trained, or auto: ema where the checkpoint holds it (default)")
    q.add_argument("--force", action="store_true", help="replace existing output files")
    q.set_defaults(run=run_export)

    q = actions.add_parser("import", help="a DALLE-pytorch dalle.pt or vae.pt -> ours",
                           description="Turn a DALLE-pytorch 1.x dalle.pt (train_dalle.py) "
                                       "or vae.pt (train_vae.py) into a dalle_dist "
                                       "checkpoint that computes the same logits, with its "
                                       "Adam and LR-plateau state where the file has them. "
                                       "Read without running code (weights_only); an option "
                                       "dalle_dist cannot compute is refused by name, and "
                                       "nothing is written. DALLE-pytorch does not save its "
                                       "tokenizer: a 49408-token model takes its default "
                                       "CLIP tokenizer from the installed DALLE-pytorch or "
                                       "--bpe_path bpe_simple_vocab_16e6.txt; name any other "
                                       "with --bpe_path (docs/from-dalle-pytorch.md).")
    q.add_argument("source", metavar="SRC", help="DALLE-pytorch's dalle.pt or vae.pt")
    q.add_argument("out", metavar="OUT", help="the dalle_dist .pt file to write")
    add_flags(q, TokenizerConfig)
    add_flags(q, TamingConfig, only=["vqgan_model_path", "vqgan_config_path"], help={
        "vqgan_model_path": "for a model trained on a taming VQGAN (DALLE-pytorch's --taming): "
                            "its .ckpt, checked against the copy the dalle.pt carries",
        "vqgan_config_path": "that VQGAN's model.yaml"})
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q.set_defaults(run=run_import)


def run_inspect(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.tools import describe, inspect_checkpoint

    info = inspect_checkpoint(args.path)
    print(json.dumps(info) if args.json else "\n".join(describe(info)))
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.tools import convert_checkpoint

    done = convert_checkpoint(args.source, args.out, force=args.force, to=args.to)
    origin = f" from tag {done['tag']}" if done["tag"] else ""
    stage = f", ZeRO-{done['zero_stage']}" if done["zero_stage"] is not None else ""
    optimizer = "with" if done["optimizer"] else "no"
    print(f"wrote {done['out']}: {done['kind']}{origin} (step {done['step']}{stage}), "
          f"{done['parameters']:,} parameters in {done['tensors']} fp32 tensors, "
          f"{done['size_bytes']:,} bytes, {optimizer} optimizer state")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.tools import verify_checkpoint

    print(verify_checkpoint(args.path))
    return 0


def run_export(args: argparse.Namespace) -> int:
    if args.export_format == "dalle-pytorch":
        from dalle_dist.checkpoint.dalle_pytorch_export import write_export

        obj = write_export(args.path, args.out, force=args.force, weights=args.weights)
        kind = "vae.pt" if "vae_params" not in obj else "dalle.pt"
        print(f"wrote {args.out}: a DALLE-pytorch {kind}, {len(obj['weights'])} tensors")
        return 0
    from dalle_dist.checkpoint.export import export_checkpoint

    weights, config = export_checkpoint(args.path, args.out, force=args.force,
                                        weights=args.weights)
    print(f"wrote {weights} ({weights.stat().st_size:,} bytes)")
    print(f"wrote {config}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.dalle_pytorch import write_import

    tokenizer = from_args(TokenizerConfig, args)
    taming = from_args(TamingConfig, args)
    taming.validate()
    imported = write_import(args.source, args.out, tokenizer, force=args.force, taming=taming)
    payload = imported.payload
    configs = payload["configs"]
    count = sum(t.numel() for t in payload["weights"].values())
    if payload["kind"] == "vae":
        print(f"wrote {args.out}: a VAE ({count:,} numbers)")
    else:
        model = configs["model"]
        carried = [what for what, key in (("Adam", "optimizer"), ("scheduler", "scheduler"))
                   if payload.get(key)]
        print(f"wrote {args.out}: a DALL-E, dim {model['dim']}, depth {model['depth']}, "
              f"{','.join(model['attn_types'])}, epoch {payload['epoch']}; "
              f"{' and '.join(carried) + ' state' if carried else 'no optimizer state'}")
    for note in imported.notes:
        print(f"note: {note}")
    return 0
