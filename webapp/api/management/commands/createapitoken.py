"""`manage.py createapitoken USERNAME`: create the user if needed (role trainer unless it has one)
and print its API token on the last line, for scripts and remote recorders."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from webapp.accounts.roles import role_of, set_role


class Command(BaseCommand):
    help = (
        "Create USERNAME if needed (role trainer unless it has one) and print its API token on "
        "the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
        if (created or not user.groups.exists()) and not user.is_superuser:
            set_role(user, "trainer")
        token, _ = Token.objects.get_or_create(user=user)
        self.stderr.write(f"token for {username} ({role_of(user)})")
        self.stdout.write(token.key)
