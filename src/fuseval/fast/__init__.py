"""Triton implementations of the operators (one module per operator)."""
