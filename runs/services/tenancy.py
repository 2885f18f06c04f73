"""Use cases of the runs app that change state, each in one transaction with its
audit event: tenants, API keys, memberships and reviewers."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

from axes.utils import reset as axes_reset
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import events
from audit.services import Actor, record
from runs.models import ApiKey, Membership, Role, Scope, Tenant
from runs.models.tenancy import API_KEY_NAME_MAX_LENGTH, API_KEY_PREFIX_LENGTH
from runs.permissions import ROLE_SCOPES

_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class IssuedApiKey:
    api_key: ApiKey
    secret: str  # shown once, never stored


def parse_scopes(raw: str | list[str]) -> list[str]:
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    scopes = sorted({item.strip() for item in items if item.strip()})
    unknown = [scope for scope in scopes if scope not in Scope.values]
    if unknown or not scopes:
        raise ValueError(
            f"scopes must be a non-empty subset of {', '.join(Scope.values)}; "
            f"got {', '.join(unknown) or 'nothing'}"
        )
    return scopes


@transaction.atomic
def tenant_create(*, slug: str, name: str = "", actor: Actor) -> Tenant:
    tenant = Tenant.objects.create(slug=slug, name=name or slug)
    record(tenant=tenant, kind=events.TENANT_CREATED, actor=actor, data={"slug": slug})
    return tenant


def _personal_scopes(tenant: Tenant, user, scopes: list[str]) -> list[str]:
    """A personal key's scopes: within what its owner's role grants."""
    membership = Membership.objects.filter(tenant=tenant, user=user).first()
    if membership is None:
        raise ValueError(
            f"{user.get_username()} is not a member of {tenant.slug}: a personal "
            "key belongs to a membership"
        )
    write, read_only = ROLE_SCOPES[membership.role]
    beyond = sorted(set(scopes) - write - read_only)
    if beyond:
        granted = ", ".join(sorted(write | read_only))
        raise ValueError(
            f"a {membership.get_role_display().lower()}'s personal key may carry "
            f"only {granted}; not {', '.join(beyond)}"
        )
    return scopes


@transaction.atomic
def tenant_update(*, tenant: Tenant, slug: str, name: str, actor: Actor) -> Tenant:
    """Rename a tenant (its slug, its name); audited with what it was."""
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    previous = {"slug": tenant.slug, "name": tenant.name}
    changed = [field for field, value in (("slug", slug), ("name", name))
               if previous[field] != value]  # fmt: skip
    if changed:
        tenant.slug, tenant.name = slug, name
        tenant.save(update_fields=changed)
        record(
            tenant=tenant,
            kind=events.TENANT_CHANGED,
            actor=actor,
            data={
                "slug": slug,
                "name": name,
                "fields": ", ".join(changed),
                "previous_slug": previous["slug"],
                "previous_name": previous["name"],
            },
        )
    return tenant


class ApiKeyNameTaken(ValueError):
    """Another key of the tenant has that name (checked, or lost a race)."""

    def __init__(self, tenant: Tenant, name: str) -> None:
        super().__init__(
            f"{tenant.slug} already has a key named {name!r}: choose another name"
        )


def api_key_name_check(
    *, tenant: Tenant, name: str, excluding: int | None = None
) -> str:
    """The key name, trimmed: not empty, and no other key of the tenant has it
    (ValueError otherwise). Names are how people tell keys apart in the admin
    and in the audit trail, so two keys of a tenant never share one."""
    name = (name or "").strip()
    if not name:
        raise ValueError("a key needs a name (what uses it, e.g. billing)")
    if len(name) > API_KEY_NAME_MAX_LENGTH:
        raise ValueError(
            f"a key's name has at most {API_KEY_NAME_MAX_LENGTH} characters"
        )
    taken = ApiKey.objects.filter(tenant=tenant, name=name).exclude(pk=excluding)
    if taken.exists():
        raise ApiKeyNameTaken(tenant, name)
    return name


def api_key_free_name(tenant: Tenant, base: str) -> str:
    """`base`, or "base 2", "base 3"... whichever no key of the tenant has."""
    taken = set(
        ApiKey.objects.filter(tenant=tenant, name__startswith=base).values_list(
            "name", flat=True
        )
    )
    number = 1
    while (candidate := base if number == 1 else f"{base} {number}") in taken:
        number += 1
    return candidate


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str],
    actor: Actor,
    user=None,
    withheld: list[str] | None = None,
) -> IssuedApiKey:
    """A service key, or with `user` a personal key of their membership (its
    scopes within what their role grants). ValueError for a bad name or
    scopes. `withheld`: capabilities the key's scopes imply that it never
    gets (its issuer's role lacks them: runs.permissions.withheld_from_key)."""
    name = api_key_name_check(tenant=tenant, name=name)
    scopes = parse_scopes(scopes)
    if user is not None:
        scopes = _personal_scopes(tenant, user, scopes)
    kind = ApiKey.Kind.PERSONAL if user is not None else ApiKey.Kind.SERVICE
    prefix = "gh_" + "".join(
        secrets.choice(_ALPHABET) for _ in range(API_KEY_PREFIX_LENGTH - 3)
    )
    secret = f"{prefix}.{secrets.token_urlsafe(32)}"
    try:
        with transaction.atomic():  # a savepoint: a lost race is a clear error
            api_key = ApiKey.objects.create(
                tenant=tenant,
                kind=kind,
                user=user,
                name=name,
                prefix=prefix,
                secret_hash=ApiKey.hash_secret(secret),
                scopes=scopes,
                withheld=sorted(withheld or ()),
            )
    except IntegrityError:  # taken meanwhile, by a transaction the check missed
        raise ApiKeyNameTaken(tenant, name) from None
    record(
        tenant=tenant,
        kind=events.API_KEY_CREATED,
        actor=actor,
        data={
            "prefix": prefix,
            "name": name,
            "scopes": ",".join(scopes),
            "key_kind": kind,
            "owner": user.get_username() if user is not None else "",
            "withheld": ",".join(sorted(withheld or ())),
        },
    )
    return IssuedApiKey(api_key=api_key, secret=secret)


@transaction.atomic
def api_key_rename(*, api_key: ApiKey, name: str, actor: Actor) -> ApiKey:
    api_key = ApiKey.objects.select_for_update().get(pk=api_key.pk)
    previous = api_key.name
    if name.strip() != previous:
        name = api_key_name_check(
            tenant=api_key.tenant, name=name, excluding=api_key.pk
        )
        api_key.name = name
        try:
            with transaction.atomic():
                api_key.save(update_fields=["name"])
        except IntegrityError:
            raise ApiKeyNameTaken(api_key.tenant, name) from None
        record(
            tenant=api_key.tenant,
            kind=events.API_KEY_RENAMED,
            actor=actor,
            data={"prefix": api_key.prefix, "name": name, "previous": previous},
        )
    return api_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey, actor: Actor) -> ApiKey:
    api_key = ApiKey.objects.select_for_update().get(pk=api_key.pk)
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        record(
            tenant=api_key.tenant,
            kind=events.API_KEY_REVOKED,
            actor=actor,
            data={"prefix": api_key.prefix, "name": api_key.name},
        )
    return api_key


@transaction.atomic
def membership_set(*, tenant: Tenant, user, role: str, actor: Actor) -> Membership:
    """Give a user a role in a tenant, or change the role they have."""
    if role not in Role.values:
        raise ValueError(f"role must be one of {', '.join(Role.values)}, not {role!r}")
    membership, created = Membership.objects.update_or_create(
        tenant=tenant, user=user, defaults={"role": role}
    )
    record(
        tenant=tenant,
        kind=events.MEMBERSHIP_CREATED if created else events.MEMBERSHIP_CHANGED,
        actor=actor,
        data={"username": user.get_username(), "role": role},
    )
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership, actor: Actor) -> None:
    """Remove a membership; the member's personal keys of the tenant are
    revoked with it."""
    for api_key in ApiKey.objects.filter(
        tenant=membership.tenant, user=membership.user, revoked_at=None
    ):
        api_key_revoke(api_key=api_key, actor=actor)
    record(
        tenant=membership.tenant,
        kind=events.MEMBERSHIP_REMOVED,
        actor=actor,
        data={"username": membership.user.get_username(), "role": membership.role},
    )
    membership.delete()


def reviewer_create(
    *, tenant: Tenant, username: str, password: str, role: str, actor: Actor
) -> Membership:
    """A staff user who can log in to the admin, with a role in one tenant."""
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": True}
        )
        if created or password:
            user.set_password(password)
        user.is_staff = True
        user.save()
        return membership_set(tenant=tenant, user=user, role=role, actor=actor)


def _tenants_of_username(username: str) -> list[Tenant]:
    return list(
        Tenant.objects.filter(memberships__user__username=username)
        .distinct()
        .order_by("pk")
    )


@transaction.atomic
def login_lockout_record(*, username: str, ip_address: str, failures: int) -> None:
    """Audit an admin login locked out by django-axes, in each tenant the
    username is a member of (an unknown username belongs to no tenant)."""
    for tenant in _tenants_of_username(username or ""):
        record(
            tenant=tenant,
            kind=events.LOGIN_LOCKED_OUT,
            actor=Actor.system("login throttling"),
            data={
                "username": username[:200],
                "ip_address": ip_address or "",
                "failures": failures,
            },
        )


@transaction.atomic
def login_lockout_lift(*, username: str, actor: Actor, tenants: list[Tenant]) -> int:
    """Lift the lockouts of `username` (every address); audited in `tenants`,
    the ones the lifting person answers for. The attempts lifted."""
    lifted = axes_reset(username=username)
    for tenant in tenants:
        record(
            tenant=tenant,
            kind=events.LOGIN_UNLOCKED,
            actor=actor,
            data={"username": username[:200], "attempts": lifted},
        )
    return lifted
