"""Fusion rules, one file per fusion. Each module exposes its Rule objects as RULES."""
