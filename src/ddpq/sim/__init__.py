"""Replaying job traces through the real planner with a simulated clock (``python -m ddpq.sim``)."""
