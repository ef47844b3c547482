"""Flags of `checkpoint inspect | convert | verify | export` (logic: dalle_dist.checkpoint.tools).

checkpoint.tools imports torch and the models: it is imported inside each command, so
`dalle-dist --help` stays cheap.
"""

from __future__ import annotations

import argparse
import json

from dalle_dist.config_base import JsonOutput, add_flags


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

    q = actions.add_parser("export", help="inference weights as safetensors + JSON config",
                           description="Write OUT.safetensors (keys prefixed 'dalle.' and "
                                       "'vae.') and OUT.json (configs, step, version). "
                                       "safetensors is the only format for now.")
    q.add_argument("path", metavar="PATH", help="NAME.pt, NAME-sharded/ or NAME-ds-cp/")
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
    from dalle_dist.checkpoint.export import export_checkpoint

    weights, config = export_checkpoint(args.path, args.out, force=args.force)
    print(f"wrote {weights} ({weights.stat().st_size:,} bytes)")
    print(f"wrote {config}")
    return 0
