"""The Slurm executor: jobs run as Slurm batch jobs, on a cluster's nodes (docs/slurm.md)."""

from ddpq.executors.slurm.executor import SlurmExecutor

__all__ = ["SlurmExecutor"]
