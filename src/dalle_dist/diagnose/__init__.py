"""Judging a run without training it.

environment  what this machine can run (`dalle-dist check`): facts, and the backends' and
             precisions' own verdicts from the registry
doctor       what went wrong in a failed run's log (`dalle-dist doctor`), by signatures
plan         memory per GPU of a run, per backend, ZeRO stage and precision (`dalle-dist
             plan`), from the model built on the meta device

Imports model (meta-device shapes) and the backend registry, nothing of train. The package
itself imports nothing, so `doctor` stays free of torch.
"""
