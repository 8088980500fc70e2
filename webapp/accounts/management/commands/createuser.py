from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from webapp.accounts.roles import ROLES, set_role


class Command(BaseCommand):
    help = "Create or update a user with a role (viewer, annotator, trainer, admin)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        parser.add_argument("--role", default="viewer", choices=ROLES)

    def handle(self, *args, username: str, password: str, role: str, **options):
        if len(password) < 8:
            raise CommandError("--password: must be at least 8 characters")
        user, created = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = role == "admin"
        user.is_superuser = role == "admin"
        user.save()
        set_role(user, role)
        self.stdout.write(f"{'created' if created else 'updated'} {username} ({role})")
