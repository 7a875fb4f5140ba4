"""The HTTP client and the ``ddpq`` CLI. Never imports server code."""
