"""`dalle-dist check`: what this machine can run, before anything is launched.

environment  facts about torch, devices, shared memory and engines, and the backends' and
             precisions' own verdicts from the registry (backends/registry.py), the same
             ones `train` asks before it starts (`report`: the --json schema)

A package of its own because it imports torch and every backend's probes, which `doctor`
(reading a log where those may be broken) must not, and it judges the machine, not a
planned run (`plan`). Above the backends in the layers: it asks them, they never ask it.
"""
