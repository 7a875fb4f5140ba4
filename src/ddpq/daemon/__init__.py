"""The daemon's side of the ``ddpq`` command: ``serve``, ``server``, ``worker`` and ``admin``.

``run`` wires the server and the worker into one daemon, ``state_folder`` owns the state
folder's modes and locks, ``settings`` loads the settings from flags, the environment and
the config file, ``commands`` and ``admin`` are the Typer commands. Empty on purpose:
importing the commands must not import the server, the worker or SQLAlchemy.
"""
