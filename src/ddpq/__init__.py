"""ddpq: a GPU job queue daemon for a lab's shared training server."""

__version__ = "0.1.0"
