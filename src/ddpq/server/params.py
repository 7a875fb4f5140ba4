"""Path and query parameters more than one router takes, bounded as SQLite can store them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

# SQLite integers are 64-bit: a larger id or offset is refused (422) before it reaches SQL.
INT64_MAX = 2**63 - 1

JobId = Annotated[int, Path(ge=1, le=INT64_MAX)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]
