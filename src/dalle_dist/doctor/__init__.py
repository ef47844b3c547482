"""`dalle-dist doctor`: what went wrong in a failed run's log, read as text only.

diagnosis   the verdict: which matching signature decides, its place in the log, the
            confidence and the alternatives (`diagnose`, `Diagnosis`)
log         a log as doctor reads it: its own lines to quote, cleaned lines to match,
            and a search that tries each pattern on the prefilter's lines only
cleaning    what is removed before matching: ANSI colours, launcher, logger and CI
            prefixes, typographic punctuation
prefilter   which lines a pattern can match, from its literal runs (speed only: it never
            changes what is found)
signatures  the knowledge, as data: one module per category, each entry with its priority

A package of its own, apart from `check` and `plan`, because it must work where those
cannot: it is pure text matching and imports neither torch nor any engine, nor anything of
dalle_dist beyond the shared modules (tests/test_layers.py checks it), so `dalle-dist
doctor` reads a log on a machine whose torch or engines are broken. This file imports
nothing, so importing a part of the package loads only that part.
"""
