"""Symbolic identities; see proofs/core.py for the registry."""
