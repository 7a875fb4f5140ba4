"""Names that reach the operating system, checked the same way everywhere."""

from __future__ import annotations

import re

# A portable Unix account name (POSIX, plus the trailing '$' of machine accounts).
UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\$?\Z")
