"""``ddpq admin ...``: users and their tokens, backups, retention, limits and reservations
(``admin_limits``), on the state folder directly (run on the server, as the daemon's
account). Imports only Typer until a command runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpq.daemon import admin_limits
from ddpq.daemon.commands import (
    ConfigOpt,
    HomeOpt,
    SettingSwitch,
    SettingText,
    ShowsSettingsDefaults,
    fail,
    not_found,
)

app = typer.Typer(
    help="Local administration (run on the server, reads the state folder).",
    rich_markup_mode=None,
)
user_app = typer.Typer(help="Users and their API tokens.", rich_markup_mode=None)
app.add_typer(user_app, name="user")


def _settings(flags: dict[str, Any], config: Path | None) -> Any:
    """The settings as the daemon would have them (flags, DDPQ_*, the config file)."""
    from ddpq.config import ConfigError
    from ddpq.daemon.settings import load_settings

    try:
        return load_settings(flags, config)
    except ConfigError as exc:
        fail(str(exc), 2)


def _admin_db(home: Path | None, config: Path | None) -> Any:
    """The state folder's database, found as the daemon finds it (--home, $DDPQ_HOME, the
    config file's `home`, the default), migrated to head."""
    from ddpq.store.db import Database, migrate

    settings = _settings({"home": home}, config)
    new = not settings.db_path.exists()
    try:
        settings.home.mkdir(parents=True, exist_ok=True)
        migrate(settings.db_path)
    except PermissionError as exc:  # an admin who forgot sudo: one line, not a trace
        fail(f"cannot open ddpq's state at {settings.home}: {exc.strerror} (as root: sudo)", 1)
    if new:
        # Said, not silent: a daemon whose home comes from its unit's environment
        # (DDPQ_HOME) keeps its state elsewhere, and this one would serve nothing.
        typer.echo(
            f"ddpq: note: no state at {settings.home} yet: made a new one; if the daemon "
            "keeps its state elsewhere, give its --home (or DDPQ_HOME)",
            err=True,
        )
    return Database(settings.db_path)


@user_app.command("add", cls=ShowsSettingsDefaults)
def user_add(
    name: str,
    admin: Annotated[bool, typer.Option(help="may cancel anyone's job")] = False,
    unix_user: Annotated[
        str | None, typer.Option(help="Unix account the user's jobs run as (root daemon)")
    ] = None,
    home: HomeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Create a user and print their token (once: only a hash is stored).

    A root daemon with --auth runs the user's jobs as the Unix account given with
    --unix-user; without it, as the account of the same name if that is an ordinary
    login account (not root, not a system account). The mapping is stored either way.
    """
    from ddpq.schemas import NAME_RE
    from ddpq.store import users

    if not NAME_RE.match(name):
        fail("a user name is 1-64 letters, digits, '.', '_' or '-'", 2)
    if unix_user is not None:
        _check_account(unix_user)
    else:
        unix_user = _same_name_account(name)
    db = _admin_db(home, config)
    try:
        with db.write() as s:
            _, token = users.add_user(s, name, admin=admin, unix_user=unix_user, now=time.time())
    except users.UserExists as exc:
        fail(str(exc), 1)
    finally:
        db.dispose()
    typer.echo(token)
    where = f"Unix account {unix_user!r}" if unix_user else "no account (`ddpq admin user map`)"
    typer.echo(f"{name}: jobs under a root daemon run as {where}", err=True)
    if unix_user != name and _account_exists(name):
        # One namespace: the daemon's socket knows that account by this same name.
        typer.echo(
            f"ddpq: note: {name} is also a Unix account here, which the daemon's socket "
            f"knows as {name}: it may act on this user's jobs (choose another name unless "
            "they are the same person)",
            err=True,
        )


def _check_account(unix_user: str) -> None:
    import pwd

    from ddpq.store.users import UNIX_NAME

    if not UNIX_NAME.match(unix_user):
        fail(f"--unix-user {unix_user!r} is not a Unix account name", 2)
    try:
        pwd.getpwnam(unix_user)
    except KeyError:
        fail(f"no Unix account {unix_user!r} on this host", 2)


def _account_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _same_name_account(name: str) -> str | None:
    """The login account named like the ddpq user, unless it is root or a system account."""
    import pwd

    from ddpq.store.users import UNIX_NAME

    if not UNIX_NAME.match(name):
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    low, high = _login_uids()
    return name if low <= entry.pw_uid <= high else None


def _login_uids(login_defs: str = "/etc/login.defs") -> tuple[int, int]:
    """UID_MIN..UID_MAX of /etc/login.defs (1000..60000 where it does not say): outside
    it are system accounts, and nobody (65534)."""
    found = {"UID_MIN": 1000, "UID_MAX": 60000}
    try:
        with open(login_defs) as f:
            for line in f:
                key, *value = line.split()
                if key in found and len(value) == 1 and value[0].isdigit():
                    found[key] = int(value[0])
    except (OSError, ValueError):
        pass
    return found["UID_MIN"], found["UID_MAX"]


@user_app.command("map", cls=ShowsSettingsDefaults)
def user_map(
    name: str,
    unix_user: Annotated[
        str | None, typer.Argument(help="the Unix account; leave out with --clear")
    ] = None,
    clear: Annotated[bool, typer.Option(help="map the user to no account")] = False,
    home: HomeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Choose the Unix account a user's jobs run as under a root daemon (uid 0 only if named)."""
    from ddpq.store import users

    if (unix_user is None) == (not clear):
        fail("give a Unix account, or --clear", 2)
    if unix_user is not None:
        _check_account(unix_user)
    db = _admin_db(home, config)
    try:
        with db.write() as s:
            users.map_unix_user(s, name, unix_user)
    except LookupError as exc:
        fail(not_found(exc), 4)
    finally:
        db.dispose()
    typer.echo(f"{name}: jobs run as {unix_user!r}" if unix_user else f"{name}: mapped to none")


@user_app.command("list", cls=ShowsSettingsDefaults)
def user_list(home: HomeOpt = None, config: ConfigOpt = None) -> None:
    """Users, whether admin, and their Unix account."""
    from ddpq.store import users

    db = _admin_db(home, config)
    with db.read() as s:
        for u in users.all_users(s):
            typer.echo(f"{u.name}\t{'admin' if u.is_admin else 'user'}\t{u.unix_user or '-'}")
    db.dispose()


@user_app.command("remove", cls=ShowsSettingsDefaults)
def user_remove(name: str, home: HomeOpt = None, config: ConfigOpt = None) -> None:
    """Delete a user (their token stops working)."""
    from ddpq.store import users

    db = _admin_db(home, config)
    try:
        with db.write() as s:
            users.remove_user(s, name)
    except LookupError as exc:
        fail(not_found(exc), 1)
    finally:
        db.dispose()
    typer.echo(f"removed {name}")


@app.command("backup", cls=ShowsSettingsDefaults)
def backup(
    path: Annotated[Path, typer.Argument(help="the new file to write (never overwritten)")],
    home: HomeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Copy the database to PATH, consistently, while the daemon runs (SQLite's backup API).

    The copy is one file, 0600: it holds token hashes and every job's --env. Job folders
    (logs, checkpoints) are not in it. Restore: docs/admin.md.
    """
    import os

    settings = _settings({"home": home}, config)
    if os.path.lexists(path):
        fail(f"{path} exists already; give the name of a new file", 2)
    if not path.parent.is_dir():
        fail(f"{path.parent} is not a folder that exists", 2)
    if not settings.db_path.is_file():
        fail(f"no database at {settings.db_path} (is --home or $DDPQ_HOME right?)", 2)
    from ddpq.daemon.janitor import approx_size
    from ddpq.store.backup import BackupFailed, backup_database

    try:
        size = backup_database(settings.db_path, path)
    except FileExistsError:
        fail(f"{path} exists already; give the name of a new file", 2)
    except (BackupFailed, OSError) as exc:
        fail(f"backup failed: {exc}", 1)
    typer.echo(f"{settings.db_path} copied to {path} ({approx_size(size)})")


@app.command("prune", cls=ShowsSettingsDefaults)
def prune(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only show what would be removed")
    ] = False,
    keep_finished: SettingText = None,
    jobs_budget: SettingText = None,
    prune_rows: SettingSwitch = None,
    home: HomeOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Apply retention once, now: what `ddpq serve --keep-finished/--jobs-budget` does on
    its own every 10 minutes, with the same settings unless these options say otherwise.
    Never touches a job that has not finished."""
    from ddpq.core.retention import What
    from ddpq.daemon.janitor import Janitor, approx_size

    flags = {
        "home": home,
        "keep_finished": keep_finished,
        "jobs_budget": jobs_budget,
        "prune_rows": prune_rows,
    }
    settings = _settings(flags, config)
    if settings.keep_finished_s is None and settings.jobs_budget_bytes is None:
        fail(
            "nothing to prune by: give --keep-finished or --jobs-budget (or set keep_finished "
            "or jobs_budget in the config file, DDPQ_KEEP_FINISHED or DDPQ_JOBS_BUDGET)",
            2,
        )
    if not settings.db_path.is_file():
        fail(f"no database at {settings.db_path} (is --home or $DDPQ_HOME right?)", 2)
    from ddpq.store.db import migrate

    migrate(settings.db_path)
    janitor = Janitor(settings)
    try:
        report = janitor.prune(dry_run=dry_run)
    finally:
        janitor.db.dispose()
    verb = "would go" if dry_run else "removed"
    for r in report.plan.removals:
        size = f", {approx_size(r.bytes)}" if r.what is not What.ROW else ""
        typer.echo(f"job {r.job_id}: {r.what.value}{size} {verb} ({r.why})")
    typer.echo(report.summary())


admin_limits.register(app, _admin_db, _settings)
