"""A change to a job (``PATCH /v1/jobs/{id}``), and the changes a restart makes on the way
(``POST /v1/jobs/{id}/restart``): the fields an owner could have submitted it with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ddpq.schemas import submit_rules as rules
from ddpq.schemas.common import NAME_PATTERN, PRIORITY_MAX, PRIORITY_MIN, USER_PRIORITY_MAX, Text


class JobChanges(BaseModel):
    """What to change; a field left out stays as it is. Strict types, as a submission's."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"priority": 10, "time_limit_s": 3600}, {"gpus": 2}]},
    )

    priority: int | None = Field(
        default=None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description=f"with --auth, above {USER_PRIORITY_MAX} needs an admin",
    )
    time_limit_s: float | None = Field(
        default=None,
        gt=0,
        le=365 * 24 * 3600,
        allow_inf_nan=False,
        description="a running job's owner may only lower it; an admin may raise it",
    )
    no_time_limit: bool = Field(
        default=False, description="remove the time limit (admins, for a running job)"
    )
    gpus: int | None = Field(default=None, ge=0, le=1024)
    name: Text | None = Field(default=None, json_schema_extra={"pattern": NAME_PATTERN})
    hold: bool | None = Field(
        default=None, description="true: hold it; false: release it (waiting jobs only)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return rules.check_name(v)

    @model_validator(mode="after")
    def _one_time_limit(self) -> JobChanges:
        if self.no_time_limit and self.time_limit_s is not None:
            raise ValueError("give time_limit_s or no_time_limit, not both")
        return self

    def values(self) -> dict[str, Any]:
        """The job's fields to set (``JobSpec``'s names), those given only; not the hold."""
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in ("priority", "time_limit_s", "gpus", "name")
            if getattr(self, k) is not None
        }
        if self.no_time_limit:
            out["time_limit_s"] = None
        return out
