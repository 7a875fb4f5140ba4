"""``python -m ddpq`` is the ``ddpq`` command."""

from ddpq.entry import main

main()
