"""Creates (once) the demo tenant, its people and the API key that `make run` prints.

One person per role the README's walkthrough shows: a plain reviewer, a
compliance officer and an auditor. The credentials are kept in var/demo.env
(0600), so running it again reuses them: the API key's secret exists nowhere
else (only its digest is stored).
"""

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import authenticate
from django.core.management.base import BaseCommand

from audit.services import Actor
from runs import services
from runs.models import ApiKey, Membership, Role, Scope, Tenant

DEMO_TENANT = "demo"
# (variable prefix in demo.env, username, role)
DEMO_PEOPLE = (
    ("GATEHOUSE_REVIEWER", "reviewer", Role.REVIEWER),
    ("GATEHOUSE_COMPLIANCE_OFFICER", "compliance", Role.COMPLIANCE_OFFICER),
    ("GATEHOUSE_AUDITOR", "auditor", Role.AUDITOR),
)


def _read_env(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (
        line.split("=", 1) for line in path.read_text().splitlines() if "=" in line
    )
    return {key.strip(): value.strip() for key, value in pairs}


class Command(BaseCommand):
    help = (
        "Create the demo tenant, a reviewer, a compliance officer, an auditor and "
        "an API key (idempotent); write them to var/demo.env."
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

        values = {"GATEHOUSE_URL": url}
        for variable, username, role in DEMO_PEOPLE:
            password = known.get(f"{variable}_PASSWORD", "")
            user = password and authenticate(username=username, password=password)
            in_role = (
                user
                and Membership.objects.for_tenant(tenant)
                .filter(user=user, role=role)
                .exists()
            )
            if not in_role:
                password = secrets.token_urlsafe(12)
                services.reviewer_create(
                    tenant=tenant,
                    username=username,
                    password=password,
                    role=role,
                    actor=actor,
                )
            values[variable] = username
            values[f"{variable}_PASSWORD"] = password

        secret = known.get("GATEHOUSE_API_KEY", "")
        key = ApiKey.objects.filter(
            tenant=tenant, prefix=secret.split(".", 1)[0], revoked_at=None
        ).first()
        if key is None or not key.matches(secret):
            secret = services.api_key_create(
                tenant=tenant,
                name=services.api_key_free_name(tenant, "demo key"),
                scopes=list(Scope.values),
                actor=actor,
            ).secret
        values["GATEHOUSE_API_KEY"] = secret

        # The folder is private and the umask 077 (config.embedded); the chmod
        # also covers a demo.env an older version left readable.
        env_path.write_text(
            "".join(f"{key}={value}\n" for key, value in values.items())
        )
        env_path.chmod(0o600)
        people = [
            f"  {role.label + ':':<20} {values[variable]} / "
            f"{values[f'{variable}_PASSWORD']}"
            for variable, _, role in DEMO_PEOPLE
        ]
        self.stdout.write(
            "\n".join(
                [
                    "",
                    "Gatehouse (embedded mode)",
                    f"  {'Admin:':<20} {url}/admin/",
                    f"  {'API docs:':<20} {url}/api/v1/docs",
                    *people,
                    f"  {'API key:':<20} {secret}",
                    f"  (also in {env_path}; `source {env_path}` for the README's curl)",
                    "",
                ]
            )
        )
