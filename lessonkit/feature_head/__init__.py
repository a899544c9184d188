"""The feature head: an EAGLE-3-style drafter on the target's own hidden states (head.py: the model; drafter.py: drafting)."""
