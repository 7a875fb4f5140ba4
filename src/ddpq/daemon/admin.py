"""``ddpq admin user ...``: users and their tokens, on the state folder directly (run on
the server, as the daemon's account). Imports only Typer until a command runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpq.daemon.commands import ConfigOpt, HomeOpt, ShowsSettingsDefaults, fail

app = typer.Typer(
    help="Local administration (run on the server, reads the state folder).",
    rich_markup_mode=None,
)
user_app = typer.Typer(help="Users and their API tokens.", rich_markup_mode=None)
app.add_typer(user_app, name="user")


def _admin_db(home: Path | None, config: Path | None) -> Any:
    """The state folder's database, found as the daemon finds it (--home, $DDPQ_HOME, the
    config file's `home`, the default), migrated to head."""
    from ddpq.config import ConfigError
    from ddpq.daemon.settings import load_settings
    from ddpq.store.db import Database, migrate

    try:
        settings = load_settings({"home": home}, config)
    except ConfigError as exc:
        fail(str(exc), 2)
    settings.home.mkdir(parents=True, exist_ok=True)
    migrate(settings.db_path)
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


def _check_account(unix_user: str) -> None:
    import pwd

    from ddpq.store.users import UNIX_NAME

    if not UNIX_NAME.match(unix_user):
        fail(f"--unix-user {unix_user!r} is not a Unix account name", 2)
    try:
        pwd.getpwnam(unix_user)
    except KeyError:
        fail(f"no Unix account {unix_user!r} on this host", 2)


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
        fail(str(exc).strip("'\""), 4)
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
        fail(str(exc).strip("'\""), 1)
    finally:
        db.dispose()
    typer.echo(f"removed {name}")
