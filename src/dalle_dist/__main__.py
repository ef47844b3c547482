"""`python -m dalle_dist` runs the command line, as launchers (torchrun, deepspeed) need."""

from dalle_dist.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
