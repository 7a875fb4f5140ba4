"""The local executor: a shim per attempt on this host (``shim.py``), tracked by cgroup."""

from ddpq.executors.local.executor import LocalExecutor as LocalExecutor
