"""What every wire schema shares: the text type a request's strings are, names, the limits of
a submission, and the body of every error."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel

# Defined where the CLI reads them without pydantic; still importable from here.
from ddpq.core.jobenv import ENV_KEY_RE as ENV_KEY_RE
from ddpq.core.jobenv import MAX_ENV_BYTES as MAX_ENV_BYTES
from ddpq.core.jobenv import MAX_ENV_VALUE as MAX_ENV_VALUE
from ddpq.core.jobenv import MAX_ENV_VARS as MAX_ENV_VARS
from ddpq.core.jobenv import RESERVED_ENV as RESERVED_ENV
from ddpq.core.names import DEFAULT_API_ADDRESS as DEFAULT_API_ADDRESS
from ddpq.core.names import NAME_PATTERN as NAME_PATTERN
from ddpq.core.names import NAME_RE as NAME_RE
from ddpq.core.names import NAME_RULE as NAME_RULE

MAX_ARGS = 1024
MAX_NODES = 64
MAX_ARG_LEN = 4096
MAX_COMMAND_BYTES = 64 * 1024
CWD_PATTERN = "^/[^\\u0000]*$"
# What a non-admin may ask for (admins: PRIORITY_MAX). Without --auth every caller is an
# admin: the daemon then believes whatever name a client sends, so a cap would be theatre.
USER_PRIORITY_MAX = 100
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000


def _encodable(value: str) -> str:
    """Refuse a string that cannot be written as UTF-8 (a lone surrogate, ``"\\ud800"`` in JSON).

    Python's JSON parser accepts such escapes, SQLite stores them inside JSON columns, and
    then no response that contains them can be encoded: refused at the door, the value never
    reaches the database.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "contains a character that is not valid Unicode (a lone surrogate)"
        ) from None
    return value


# Every string a request may carry is this type.
Text = Annotated[str, AfterValidator(_encodable)]


def derive_name(program: str) -> str:
    """A job name from a program path that always passes NAME_RE ("job" if nothing is left).

    The basename's runs of other characters (spaces, control characters, non-ASCII, escape
    sequences) become one '-', and the name starts with a letter or digit.
    """
    base = program.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:64]
    return name if NAME_RE.match(name) else "job"


class ErrorOut(BaseModel):
    """Every error the API returns has this shape."""

    detail: str
    code: str
