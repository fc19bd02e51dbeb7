"""Delete for good the sessions that have sat in the trash for longer than a set number of days.

Deleting a chat in the web app only moves it to the trash (Undo, Restore); without a purge the trash
would keep every deleted conversation forever. Run it from cron or a scheduler, e.g. daily.
"""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from sessions_core.models import ChatSession


class Command(BaseCommand):
    help = "Delete sessions that have been in the trash for more than --days days (default 30)."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=30, help="Age in the trash before a session is deleted.")
        parser.add_argument("--dry-run", action="store_true", help="Only say how many sessions would go.")

    def handle(self, *args, days: int, dry_run: bool, **options):
        if days < 0:
            raise CommandError("--days must be 0 or more.")
        expired = ChatSession.objects.trashed().filter(deleted_at__lt=timezone.now() - timedelta(days=days))
        count = expired.count()
        if dry_run:
            self.stdout.write(f"{count} session(s) in the trash for more than {days} days would be deleted.")
            return
        expired.delete()
        self.stdout.write(self.style.SUCCESS(f"Deleted {count} session(s) from the trash (older than {days} days)."))
