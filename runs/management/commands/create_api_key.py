from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from runs import services
from runs.management.commands._helpers import tenant_by_slug


class Command(BaseCommand):
    help = (
        "Create an API key; the secret is printed once, on the last line. With "
        "--user, a personal key: it acts as that member, within their role."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument(
            "--scopes",
            required=True,
            help="comma-separated: runs,approvals,audit,time_travel "
            "(time_travel: forks and runs from a checkpoint)",
        )
        parser.add_argument(
            "--name",
            default=None,
            help='what uses the key, unique in the tenant (default: "cli key", '
            'or "<user>\'s key", numbered when taken)',
        )
        parser.add_argument(
            "--user",
            default="",
            help="a member's username: the key is theirs and decides as them "
            "(a personal key); without it, a service key",
        )

    def handle(
        self, *args, tenant: str, scopes: str, name: str | None, user: str, **options
    ):
        tenant_obj = tenant_by_slug(tenant)
        owner = None
        if user:
            owner = get_user_model().objects.filter(username=user).first()
            if owner is None:
                raise CommandError(f"no user {user!r}")
        if name is None:
            name = services.api_key_free_name(
                tenant_obj, f"{user}'s key" if user else "cli key"
            )
        try:
            scope_list = services.parse_scopes(scopes)
            issued = services.api_key_create(
                tenant=tenant_obj,
                name=name,
                scopes=scope_list,
                actor=Actor.system("manage.py"),
                user=owner,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        kind = f"personal API key of {user}" if owner else "service API key"
        self.stderr.write(
            f"{kind} {issued.api_key.name!r} ({issued.api_key.prefix}) for "
            f"{tenant_obj.slug} with scopes {issued.api_key.scope_labels}. Store the "
            "secret now: it is not kept."
        )
        self.stdout.write(issued.secret)
