"""Where jobs run: the executor interface (``base``) and its implementations."""
