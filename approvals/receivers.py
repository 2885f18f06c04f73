"""approvals reacts to runs through signals, so that runs never imports it."""

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from approvals.models import ApprovalNotice
from approvals.notifications import owed_to_member_dropped
from approvals.services import (
    approval_interrupts_move,
    approval_requests_open,
    approvals_close_for_thread,
)
from runs.models import Membership
from runs.signals import interrupts_moved, run_interrupted, thread_closed


@receiver(run_interrupted, dispatch_uid="approvals.open_requests")
def open_approval_requests(sender, *, run, interrupts, **kwargs) -> None:
    approval_requests_open(run=run, interrupts=interrupts)


@receiver(thread_closed, dispatch_uid="approvals.close_requests")
def close_approval_requests(sender, *, thread, actor, reason, **kwargs) -> None:
    approvals_close_for_thread(thread=thread, actor=actor, reason=reason)


@receiver(interrupts_moved, dispatch_uid="approvals.move_interrupts")
def move_approval_requests(sender, *, thread, moved, **kwargs) -> None:
    approval_interrupts_move(thread=thread, moved=moved)


# Approval e-mails owed to a member go with their membership (whoever removes
# it: runs.services.membership_remove, the admin), with the roles they no
# longer have, and with their account's deactivation: the mail would reach
# someone no longer entitled to it. send_owed checks again at send time.


@receiver(post_delete, sender=Membership, dispatch_uid="approvals.membership_gone")
def drop_notices_of_removed_member(sender, instance, **kwargs) -> None:
    owed_to_member_dropped(
        tenant_id=instance.tenant_id, user_id=instance.user_id, role=None
    )


@receiver(post_save, sender=Membership, dispatch_uid="approvals.membership_changed")
def drop_notices_of_other_roles(sender, instance, created, **kwargs) -> None:
    if not created:
        owed_to_member_dropped(
            tenant_id=instance.tenant_id, user_id=instance.user_id, role=instance.role
        )


@receiver(
    post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="approvals.user_inactive"
)
def drop_notices_of_inactive_user(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        ApprovalNotice.objects.filter(user_id=instance.pk).delete()
