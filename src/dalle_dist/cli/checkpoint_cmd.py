"""Flags of `checkpoint inspect | convert | verify | export` (logic: dalle_dist.checkpoint.tools).

checkpoint.tools imports torch and the models: it is imported inside each command, so
`dalle-dist --help` stays cheap.
"""

from __future__ import annotations

import argparse
import json

from dalle_dist.config_base import JsonOutput, add_flags


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.description = ("Tools for dalle_dist checkpoints: a single NAME.pt file "
                     "or a DeepSpeed NAME-ds-cp/ directory.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    q = actions.add_parser("inspect", help="what a checkpoint holds, without reading weights",
                           description="Print kind, configs, step, backend, sizes and "
                                       "parameter counts. Weights are not read.")
    q.add_argument("path", metavar="PATH", help="NAME.pt or NAME-ds-cp/")
    add_flags(q, JsonOutput)
    q.set_defaults(run=run_inspect)

    q = actions.add_parser("convert", help="DeepSpeed directory -> single-file checkpoint",
                           description="Consolidate the newest tag of a DeepSpeed directory "
                                       "(any ZeRO stage) into one .pt file with fp32 weights "
                                       "and no optimizer state. Needs DeepSpeed installed.")
    q.add_argument("ds_dir", metavar="DS_DIR", help="NAME-ds-cp/ written by a --deepspeed run")
    q.add_argument("out", metavar="OUT", help="the .pt file to write")
    q.add_argument("--force", action="store_true", help="replace OUT if it exists")
    q.set_defaults(run=run_convert)

    q = actions.add_parser("verify", help="check weights against the configs",
                           description="Load a checkpoint, check every weight's name and "
                                       "shape against the model its config describes (and "
                                       "the VAE a DALL-E carries) and that all values are "
                                       "finite. Exit 0 with 'ok: ...', else 2.")
    q.add_argument("path", metavar="PATH", help="NAME.pt or NAME-ds-cp/")
    q.set_defaults(run=run_verify)

    q = actions.add_parser("export", help="inference weights as safetensors + JSON config",
                           description="Write OUT.safetensors (keys prefixed 'dalle.' and "
                                       "'vae.') and OUT.json (configs, step, version). "
                                       "safetensors is the only format for now.")
    q.add_argument("path", metavar="PATH", help="NAME.pt or NAME-ds-cp/")
    q.add_argument("out", metavar="OUT", help="output name; .safetensors and .json are added")
    q.add_argument("--safetensors", action="store_true", default=True,
                   help="write safetensors (the default and, for now, the only format)")
    q.add_argument("--force", action="store_true", help="replace existing output files")
    q.set_defaults(run=run_export)


def run_inspect(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.tools import describe, inspect_checkpoint

    info = inspect_checkpoint(args.path)
    print(json.dumps(info) if args.json else "\n".join(describe(info)))
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.tools import convert_checkpoint

    done = convert_checkpoint(args.ds_dir, args.out, force=args.force)
    stage = "-" if done["zero_stage"] is None else done["zero_stage"]
    print(f"wrote {done['out']}: {done['kind']} from tag {done['tag']} (step {done['step']}, "
          f"ZeRO-{stage}), {done['parameters']:,} parameters in {done['tensors']} fp32 "
          f"tensors, {done['size_bytes']:,} bytes, no optimizer state")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.tools import verify_checkpoint

    print(verify_checkpoint(args.path))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from dalle_dist.checkpoint.export import export_checkpoint

    weights, config = export_checkpoint(args.path, args.out, force=args.force)
    print(f"wrote {weights} ({weights.stat().st_size:,} bytes)")
    print(f"wrote {config}")
    return 0
