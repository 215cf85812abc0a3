"""The stub generator behind tools/gen_stub.py (see that script for its use)."""
