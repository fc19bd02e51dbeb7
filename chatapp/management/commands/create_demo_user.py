"""Create the demo account the run command prints on first start.

The password is random and shown once; run with --reset to get a new one.
"""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

USERNAME = "demo"


class Command(BaseCommand):
    help = "Create the user 'demo' with a random password and print it (idempotent; --reset sets a new password)."

    def add_arguments(self, parser):
        parser.add_argument("--reset", action="store_true", help="Give an existing demo user a new random password.")

    def handle(self, *args, reset: bool = False, **options):
        User = get_user_model()
        user = User.objects.filter(username=USERNAME).first()
        if user is not None and not reset:
            self.stdout.write(f"The demo user '{USERNAME}' already exists (run with --reset for a new password).")
            return
        password = secrets.token_urlsafe(12)
        if user is None:
            User.objects.create_user(username=USERNAME, password=password)
            verb = "Created"
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
            verb = "Reset"
        self.stdout.write(self.style.SUCCESS(
            f"{verb} the demo user. Log in with  username: {USERNAME}  password: {password}"))
