"""Accuracy checks: how close dalle_dist's estimates and verdicts come to what really happens.

plan_check        `plan`'s estimate against the measured peak memory of real training steps
                  (tests/test_plan.py runs its --quick set)
plan_vqgan_check  `plan`'s VQGAN encode bytes against the measured peak of real encodes
doctor_accuracy   `doctor`'s accuracy per category on the written and real log sets
                  (tests/diagnose/)
demo_parity       `make demo`'s caption fidelity on 1 process, torch DDP and DeepSpeed

They live with the tests because they check correctness, not speed (bench/ holds the
timings), and the tests run them or read the same data. Each prints JSON and runs from the
repository root as a module: python -m tests.accuracy.plan_check --quick. None is collected
by pytest (no test_ prefix).
"""
