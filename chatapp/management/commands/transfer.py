"""Do one import or export a user started (chatapp/transfers.py): the server starts this command for
each one, so their work never runs in a server process. `--recover` (scripts/run and scripts/serve, at
start): those whose process on this host is gone, failed and taken away."""

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from chatapp import transfers
from chatapp.models import Transfer


class Command(BaseCommand):
    help = ("Do the import or export with this pk (in a child process that it watches; --work: the work itself), "
            "or --recover those whose process is gone.")

    def add_arguments(self, parser):
        parser.add_argument("transfer", type=int, nargs="?")
        parser.add_argument("--work", action="store_true", help="Do the work in this process (the child).")
        parser.add_argument("--recover", action="store_true",
                            help="Fail the unfinished transfers whose process on this host is gone.")
        parser.add_argument("--database-name", default="",
                            help="The database of the process that started it (the test database, in tests).")

    def handle(self, *args, transfer: int | None = None, work: bool = False, recover: bool = False,
               database_name: str = "", **options):
        if database_name:  # before the first query: the connection is not open yet
            connections["default"].settings_dict["NAME"] = database_name
        if recover:
            stopped = transfers.recover(Transfer.objects.all())
            if stopped:
                self.stdout.write(f"{stopped} unfinished transfer(s) whose process was gone: failed, nothing kept.")
            return
        if transfer is None:
            raise CommandError("Name the transfer (its pk), or --recover.")
        if work:
            os.nice(settings.CHAT_TRANSFER_NICE)  # the server's requests go first when the cores are busy
            transfers.work(Transfer.objects.select_related("owner").get(pk=transfer))
        else:
            transfers.supervise(transfer)
