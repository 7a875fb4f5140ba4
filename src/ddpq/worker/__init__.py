"""Everything that knows about processes: the agent loop, the shim, devices, ports."""
