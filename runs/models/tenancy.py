"""Tenants and who may act for them: memberships (people) and API keys (programs)."""

import hashlib
import hmac

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.functional import cached_property

from runs.models.content import ThreadContent


class TenantOwnedQuerySet(models.QuerySet):
    """The one way to read tenant-owned rows: every query names its tenant."""

    tenant_field = "tenant"

    def for_tenant(self, tenant: "Tenant") -> "TenantOwnedQuerySet":
        if tenant is None:
            # A query without a tenant is a bug, never "all tenants".
            raise ValueError("for_tenant() needs a tenant; refusing an unscoped query")
        return self.filter(**{self.tenant_field: tenant})


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    REVIEWER = "reviewer", "Reviewer"
    COMPLIANCE_OFFICER = "compliance_officer", "Compliance officer"
    AUDITOR = "auditor", "Auditor"
    TENANT_ADMIN = "tenant_admin", "Tenant admin"


class Scope(models.TextChoices):
    RUNS = "runs", "Runs"
    APPROVALS = "approvals", "Approvals"
    AUDIT = "audit", "Audit"
    # Forks and runs from a checkpoint. Never implied by another scope and
    # granted by no role: a key gets it only when it is asked for.
    TIME_TRAVEL = "time_travel", "Time travel"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=32, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], name="membership_user_tenant"
            )
        ]
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.user} ({self.get_role_display()}) in {self.tenant}"


API_KEY_PREFIX_LENGTH = 12
API_KEY_NAME_MAX_LENGTH = 200


class ApiKey(models.Model):
    """A credential. Only a digest of the secret is stored.

    A service key is a program's: it acts with its own scopes and is nobody in
    particular. A personal key belongs to one person's membership of the
    tenant: it acts as that person, within their role (its scopes are cut
    down to what the role grants), and stops working when the membership
    goes. Approvals count people, so a decision through a personal key counts
    as its owner's, and one through a service key as no person's.
    """

    class Kind(models.TextChoices):
        SERVICE = "service", "Service key"
        PERSONAL = "personal", "Personal key"

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="api_keys"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SERVICE)
    # The owner of a personal key (with the tenant: their membership). Null
    # for service keys; a personal key whose owner is gone authenticates
    # nothing.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="personal_api_keys",
    )
    # Unique per tenant and never empty (runs.services.api_key_name_check).
    name = models.CharField(max_length=API_KEY_NAME_MAX_LENGTH)
    prefix = models.CharField(
        max_length=API_KEY_PREFIX_LENGTH,
        unique=True,
        validators=[RegexValidator(r"^gh_[A-Za-z0-9]+$")],
        help_text="The public start of the key, shown so that a key can be recognised.",
    )
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    # Capabilities its scopes imply that whoever issued it lacked (a `runs`
    # service key from a tenant admin would read decrypted state): never
    # granted to it (runs.permissions.can).
    withheld = models.JSONField(default=list, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kind="personal") | Q(user__isnull=True),
                name="api_key_service_has_no_user",
            ),
            models.UniqueConstraint(
                fields=["tenant", "name"],
                name="api_key_name_unique_per_tenant",
                violation_error_message="This tenant already has a key of that name.",
            ),
            models.CheckConstraint(
                condition=~Q(name=""), name="api_key_name_not_empty"
            ),
        ]
        ordering = ["tenant", "name"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def scope_labels(self) -> str:
        """The scopes in words, e.g. "Runs, Time travel"."""
        labels = dict(Scope.choices)
        return ", ".join(str(labels.get(scope, scope)) for scope in self.scopes)

    @property
    def is_personal(self) -> bool:
        return self.kind == self.Kind.PERSONAL

    @cached_property
    def owner_membership(self) -> Membership | None:
        """The membership a personal key acts through, if it still exists and
        its user may log in; None for service keys."""
        if not self.is_personal or self.user_id is None:
            return None
        return (
            Membership.objects.select_related("user", "tenant")
            .filter(
                user_id=self.user_id, tenant_id=self.tenant_id, user__is_active=True
            )
            .first()
        )

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(self.secret_hash, self.hash_secret(secret))

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class IdempotencyRecord(models.Model):
    """The first response to a write sent with an Idempotency-Key header."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    # Whose key it is ("api_key:<pk>", "user:<pk>"): each caller has its own.
    owner = models.CharField(max_length=64, default="")
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=2000)
    request_digest = models.CharField(max_length=64)
    # Null while the first request is still being handled.
    response_status = models.PositiveSmallIntegerField(null=True)
    # The response's JSON, sealed: under the thread's data key when it shows
    # that thread's content (`thread` set: a decision's answer shows the
    # request's payload and the reviewer's note), so that deleting the thread
    # shreds it with the rest; otherwise under the master key ring
    # (runs.crypto.seal).
    response_sealed = models.BinaryField(null=True, editable=False)
    # The thread whose content the response shows, if any: a replay after the
    # thread's deletion answers 404 (runs.api.idempotency).
    thread = models.ForeignKey(
        "runs.Thread",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = TenantOwnedQuerySet.as_manager()

    # Cleared when the thread is removed (runs.storage.content_clear); the
    # row, which no longer holds anything of the thread, stays until the
    # retention job `purge_idempotency_records` deletes it past
    # GATEHOUSE_IDEMPOTENCY_TTL, so the key is not taken as new meanwhile.
    thread_content = (
        ThreadContent("idempotent_responses", fields=("response_sealed",)),
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "owner", "key"], name="idempotency_owner_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}]"

    @staticmethod
    def expired(now) -> Q:
        """Records past GATEHOUSE_IDEMPOTENCY_TTL at `now`: a repeat of their
        key is new work, so they serve nothing (runs.api.idempotency)."""
        return Q(created_at__lt=now - settings.GATEHOUSE_IDEMPOTENCY_TTL)


class KeyCacheStore(models.Model):
    """A shared cache (Redis) in which web processes keep the API keys they
    verified (`runs.api.key_cache`), by the token that cache holds, and when a
    web process last said it kept keys there. While one is in use, a change of
    access made by a process whose cache is not that one (which could not
    replace the access epoch those processes read) is refused: it would not
    reach them."""

    store = models.CharField(primary_key=True, max_length=32)
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"key cache {self.store} (seen {self.seen_at:%Y-%m-%d %H:%M:%S})"
