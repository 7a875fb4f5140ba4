"""Text for people: ages, progress lines, untrusted text made safe. Pure functions.

Durations and sizes are read and written by ``ddpq.core.units`` (the daemon needs them too).
The views draw the API's JSON as it comes (``as_data``), without the wire schemas' models:
importing pydantic would cost every command ~100 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ddpq.core.finite import finite_float

# Not typing.TYPE_CHECKING: `ddpq submit` and `ddpq ls` import no ``typing`` (``client.quick``);
# nor ``datetime``, ``unicodedata`` and ``core.units`` before a function here needs them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import datetime
    from typing import Any, Protocol

    from rich.text import Text

    class Dumps(Protocol):
        """A wire schema's model (pydantic), which the views also take."""

        def model_dump(self, *, mode: str) -> dict[str, Any]: ...


Data = Mapping[str, "Any"]


def as_data(item: Data | Dumps) -> Data:
    """A job, attempt or GPU as the API's JSON, from that JSON or a wire schema's model."""
    if isinstance(item, Mapping):
        return item
    return item.model_dump(mode="json")


def when(value: str | datetime) -> datetime:
    """A time from the API's JSON (ISO 8601, "...Z" for UTC)."""
    from datetime import datetime

    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def text(value: object) -> str:
    """A field that should hold text, as text whatever the answer held (None: "")."""
    return "" if value is None else value if isinstance(value, str) else str(value)


# Invisible characters that are not controls: real text needs them (joined emoji,
# Persian and Indic scripts), and a terminal does nothing with them but join glyphs.
_JOINERS = {"\u200c", "\u200d"}
# Control (C0, DEL, C1), format (bidi overrides, zero-width spaces, BOM), lone surrogates
# (cannot be encoded for output at all), and line/paragraph separators (some terminals
# break lines on them).
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def sanitize(text: str, *, multiline: bool = False) -> str:
    """``text`` made safe to print on a terminal: every character that could move the
    cursor, change colours or the title, reorder what follows (bidi overrides), or hide
    itself is shown as a visible escape (``\\x1b``, ``\\u202e``) instead.

    For whatever came from a user or a job (names, owners, commands, reasons, progress,
    GPU names, the server's error messages). ``multiline`` keeps newlines and tabs (a log
    tail); otherwise they are escaped too, so one value stays on one line. Backslashes are
    left alone, so a literal ``\\x1b`` typed by someone looks like an escaped ESC: ``--json``
    has the exact data.
    """
    if text.isprintable():  # the common case: nothing to do (printable spaces included)
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch in _JOINERS or (multiline and ch in "\n\t"):
            out.append(ch)
        elif _category(ch) not in _UNSAFE_CATEGORIES:
            out.append(ch)  # non-ASCII spaces, private use, not yet assigned: harmless
        elif ch in _SHORT:
            out.append(_SHORT[ch])
        else:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
    return "".join(out)


def _category(ch: str) -> str:
    import unicodedata  # only for text that is not all printable

    return unicodedata.category(ch)


def safe(value: object) -> str:
    """A field of an answer (a name, a reason, a state) as one line of text safe to print."""
    return sanitize(text(value))


def plain(text: str, style: str = "") -> Text:
    """Untrusted text as a Rich renderable: sanitized, and never read as markup (``[red]``,
    ``[/bold]``, ``[link=…]``) or emoji codes (``:smile:``), as a ``str`` would be, table
    cells included."""
    from rich.text import Text

    return Text(sanitize(text), style=style)


def age(since: str | datetime, now: datetime | None = None) -> str:
    from datetime import UTC, datetime

    from ddpq.core.units import human_duration

    now = now or datetime.now(UTC)
    return human_duration((now - when(since)).total_seconds())


def number_text(value: Any) -> str:
    """A metric as people read it: a float to 4 significant digits (0.9983, 1.235e-05),
    anything else as text (a job writes what it likes)."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return text(value)


def progress_line(p: dict[str, Any] | None) -> str:
    """'epoch 3/5 · acc 71.2% · 2,400 img/s · ETA 1m10s' from a metrics.jsonl record.

    Values come from the job: print the result through ``sanitize``/``plain``.
    """
    if not p:
        return ""
    parts = []
    if "epoch" in p:
        epochs = f"/{number_text(p['epochs'])}" if "epochs" in p else ""
        parts.append(f"epoch {number_text(p['epoch'])}{epochs}")
    elif "step" in p:
        steps = f"/{number_text(p['steps'])}" if "steps" in p else ""
        parts.append(f"step {number_text(p['step'])}{steps}")
    acc = finite_float(p.get("test_acc", p.get("train_acc")))
    loss = finite_float(p.get("train_loss"))
    if acc is not None:
        parts.append(f"acc {acc * 100 if acc <= 1 else acc:.1f}%")
    elif loss is not None:
        parts.append(f"loss {loss:.3f}")
    if (speed := finite_float(p.get("images_per_s"))) is not None:
        parts.append(f"{speed:,.0f} img/s")
    if (eta := finite_float(p.get("eta_s"))) is not None:
        from ddpq.core.units import human_duration

        parts.append(f"ETA {human_duration(eta)}")
    return " · ".join(parts)


def progress_fraction(p: dict[str, Any] | None) -> float | None:
    """How far a job is, 0..1, from its latest progress record (None if it does not say)."""
    if not p:
        return None
    try:
        epochs = float(p["epochs"])
        epoch = float(p.get("epoch", 0))
        steps = float(p.get("steps") or 0)
        step = float(p.get("step") or 0)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if not all(map(math.isfinite, (epochs, epoch, steps, step))) or epochs <= 0:
        return None  # "nan" or "inf" from the job: no bar rather than a full one
    done = epoch - 1 + (step / steps if steps else 1.0) if p.get("phase") == "train" else epoch
    return max(0.0, min(1.0, done / epochs))


def notify_lines(item: Data, owed: str) -> list[str]:
    """A job's or a sweep's message: ``owed`` while no attempt was made, then each attempt
    to deliver it (the URL itself is never served)."""
    if not item.get("notify"):
        return []
    sent = item.get("notifications") or []
    if not sent:
        return [f"  notify     {owed}"]
    lines: list[str] = []
    for n in sent:
        at = f"{when(n['at']).astimezone():%Y-%m-%d %H:%M:%S}"
        status = n.get("status")
        ok = isinstance(status, int) and 200 <= status < 300
        outcome = f"delivered (HTTP {status})" if ok else sanitize(text(n.get("error")))
        label = "notify    " if not lines else "          "
        lines.append(f"  {label} #{text(n.get('attempt'))} {at}  {outcome}")
    return lines
