"""Creates (once) the demo tenant, reviewer and API key that `make run` prints.

The credentials are kept in var/demo.env, so running it again reuses them: the
API key's secret exists nowhere else (only its digest is stored).
"""

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import authenticate
from django.core.management.base import BaseCommand

from audit.services import Actor
from runs import services
from runs.models import ApiKey, Role, Tenant

DEMO_TENANT = "demo"
DEMO_REVIEWER = "reviewer"


def _read_env(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (
        line.split("=", 1) for line in path.read_text().splitlines() if "=" in line
    )
    return {key.strip(): value.strip() for key, value in pairs}


class Command(BaseCommand):
    help = (
        "Create the demo tenant, reviewer and API key (idempotent); write var/demo.env."
    )

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000")

    def handle(self, *args, url: str, **options):
        env_path = Path(settings.VAR_DIR) / "demo.env"
        known = _read_env(env_path)
        actor = Actor.system("make run")

        tenant = Tenant.objects.filter(
            slug=DEMO_TENANT
        ).first() or services.tenant_create(slug=DEMO_TENANT, name="Demo", actor=actor)

        password = known.get("GATEHOUSE_REVIEWER_PASSWORD")
        if not (password and authenticate(username=DEMO_REVIEWER, password=password)):
            password = secrets.token_urlsafe(12)
            services.reviewer_create(
                tenant=tenant,
                username=DEMO_REVIEWER,
                password=password,
                role=Role.COMPLIANCE_OFFICER,
                actor=actor,
            )

        secret = known.get("GATEHOUSE_API_KEY", "")
        prefix = secret.split(".", 1)[0]
        key = ApiKey.objects.filter(
            tenant=tenant, prefix=prefix, revoked_at=None
        ).first()
        if key is None or not key.matches(secret):
            secret = services.api_key_create(
                tenant=tenant,
                name="demo key",
                scopes=["runs", "approvals", "audit"],
                actor=actor,
            ).secret

        env_path.parent.mkdir(parents=True, exist_ok=True)
        env_path.write_text(
            f"GATEHOUSE_URL={url}\n"
            f"GATEHOUSE_API_KEY={secret}\n"
            f"GATEHOUSE_REVIEWER={DEMO_REVIEWER}\n"
            f"GATEHOUSE_REVIEWER_PASSWORD={password}\n"
        )
        env_path.chmod(0o600)
        self.stdout.write(
            "\n".join(
                [
                    "",
                    "Gatehouse is starting (embedded mode).",
                    f"  Admin:     {url}/admin/",
                    f"  API docs:  {url}/api/v1/docs",
                    f"  Reviewer:  {DEMO_REVIEWER} / {password}",
                    f"  API key:   {secret}",
                    f"  (also in {env_path}; `source {env_path}` for the README's curl)",
                    "",
                ]
            )
        )
