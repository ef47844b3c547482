"""Diagnosis without training: what went wrong in a failed run's log (doctor)."""
