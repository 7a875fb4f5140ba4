"""``python -m ddpq`` is the ``ddpq`` command."""

from ddpq.client.cli import main

main()
