"""`manage.py createuser NAME [--role ROLE]`: create or update a user with a role.

The password comes from, in order: `--password-env NAME` (the variable NAME), the
RD_PASSWORD variable, or a prompt (typed twice, not echoed) when stdin is a terminal.
`--password P` still works but is discouraged: a command line is readable by every user of
the machine (`ps`, /proc/PID/cmdline).
"""

from __future__ import annotations

import os
import sys
from getpass import getpass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from webapp.accounts.roles import ROLES, set_role

DEFAULT_VARIABLE = "RD_PASSWORD"


def _interactive() -> bool:
    return sys.stdin.isatty()


class Command(BaseCommand):
    help = (
        "Create or update a user with a role (viewer, annotator, trainer, admin). The password is "
        f"read from --password-env NAME, else ${DEFAULT_VARIABLE}, else a prompt."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--password-env",
            metavar="NAME",
            help=f"read the password from this environment variable (default {DEFAULT_VARIABLE})",
        )
        parser.add_argument(
            "--password", help="discouraged: visible to every user of the machine in `ps`"
        )
        parser.add_argument("--role", default="viewer", choices=ROLES)

    def handle(self, *args, username: str, role: str, **options):
        password = self._password(options.get("password"), options.get("password_env"))
        if len(password) < 8:
            raise CommandError("password: must be at least 8 characters")
        user, created = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = role == "admin"
        user.is_superuser = role == "admin"
        user.save()
        set_role(user, role)
        self.stdout.write(f"{'created' if created else 'updated'} {username} ({role})")

    def _password(self, given: str | None, variable: str | None) -> str:
        if given is not None:
            self.stderr.write(
                "--password is visible to every user of the machine while the command runs; "
                f"prefer {DEFAULT_VARIABLE}=... or --password-env NAME, or the prompt"
            )
            return given
        if variable:
            value = os.environ.get(variable)
            if not value:
                raise CommandError(f"--password-env: {variable} is not set (or is empty)")
            return value
        if os.environ.get(DEFAULT_VARIABLE):
            return os.environ[DEFAULT_VARIABLE]
        if not _interactive():
            raise CommandError(
                f"no password: set {DEFAULT_VARIABLE} (or --password-env NAME), or run on a "
                "terminal to be prompted"
            )
        first = getpass("Password: ")
        if getpass("Password (again): ") != first:
            raise CommandError("password: the two entries did not match")
        return first
