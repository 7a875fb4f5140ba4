"""Text for people: durations, ages, progress lines. Pure functions."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """'90', '90s', '30m', '2h', '1h30m', '1d' -> seconds."""
    text = text.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise ValueError(
                f"{text!r} is not a duration (examples: 90s, 30m, 2h, 1h30m, 1d)"
            ) from None
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def human_duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, s = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{m:02d}m"
    days, h = divmod(hours, 24)
    return f"{days}d{h:02d}h"


def age(when: datetime, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return human_duration((now - when).total_seconds())


def progress_line(p: dict[str, Any] | None) -> str:
    """'epoch 3/5 · acc 71.2% · 2,400 img/s · ETA 1m10s' from a metrics.jsonl record."""
    if not p:
        return ""
    parts = []
    if "epoch" in p:
        parts.append(f"epoch {p['epoch']}" + (f"/{p['epochs']}" if "epochs" in p else ""))
    elif "step" in p:
        parts.append(f"step {p['step']}" + (f"/{p['steps']}" if "steps" in p else ""))
    acc = p.get("test_acc", p.get("train_acc"))
    if isinstance(acc, int | float):
        parts.append(f"acc {acc * 100 if acc <= 1 else acc:.1f}%")
    elif isinstance(p.get("train_loss"), int | float):
        parts.append(f"loss {p['train_loss']:.3f}")
    if isinstance(p.get("images_per_s"), int | float):
        parts.append(f"{p['images_per_s']:,.0f} img/s")
    if isinstance(p.get("eta_s"), int | float):
        parts.append(f"ETA {human_duration(p['eta_s'])}")
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
    except (KeyError, TypeError, ValueError):
        return None
    if epochs <= 0:
        return None
    done = epoch - 1 + (step / steps if steps else 1.0) if p.get("phase") == "train" else epoch
    return max(0.0, min(1.0, done / epochs))
