"""Pure decisions: no I/O, no clocks (``now`` is always a parameter)."""
