"""Everything about checkpoints (docs/design.md, "Checkpoints"), below train/ and above backends/.

- format: the payload's schema and version, the loop position, safe reading and writing
  of one file (pickled objects refused);
- single_file: `NAME.pt` and the kept `NAME-checkpoints/step-N.pt`;
- sharded_dir, dcp_io: `NAME-sharded/` (each rank's shards through DCP, read safely);
- deepspeed_dir: `NAME-ds-cp/` (tags, auxiliary.pt, `latest` written last);
- formats: which of them a run writes (--checkpoint_format, --async_checkpoint);
- rng: every rank's RNG states;
- load: either kind read back, and the models a checkpoint rebuilds;
- resume: the newest complete checkpoint, the resume / overwrite decision, restoring;
- checkpointer: when a run saves and how many saves it keeps;
- tools, export: `dalle-dist checkpoint inspect | convert | verify | export`.

Nothing is imported here, so `import dalle_dist.checkpoint.format` stays cheap.
"""
