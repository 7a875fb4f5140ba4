"""The queue's bounds per user (issue 23), a group of ``ddpq.config_decl.Declared``'s
settings kept in a module of its own so that the declarations stay within the size a module
may have: they are declared, read and documented exactly as the others are."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator
from pydantic_settings import BaseSettings

from ddpq.config_values import Public, at_least


class QueueBounds(BaseSettings):
    """One user's flood waits, or is refused, instead of taking the box and the queue from
    everyone (``server.queue_caps``, ``core.scheduler.gates.running_cap``)."""

    max_queued_per_user: Annotated[
        int,
        AfterValidator(at_least(0)),
        Public(
            "max_queued_per_user",
            "queued and held jobs one user may have (a sweep counts each job); a submission "
            "past it is refused (0: no cap)",
            only="api",
        ),
    ] = 10_000
    max_running_per_user: Annotated[
        int,
        AfterValidator(at_least(0)),
        Public(
            "max_running_per_user",
            "jobs of one user holding leases at once, unless `ddpq admin limit` gives them "
            "(or everyone) another figure; the rest wait, saying so (0: no cap)",
            only="worker",
        ),
    ] = 1000
