"""What audit tells other apps, so that none of them needs to be imported by it.

`event_recorded` is sent once the transaction that recorded an audit event
has committed, with `event` (audit.models.AuditEvent). Every state change of
Gatehouse records an event in its own transaction, so a receiver hears of
each committed change exactly when it is visible, and of none that rolled
back. Receivers run in the process that made the change (a web request, a
worker, a management command): they must be quick, and queue real work
(webhooks queue their deliveries as Celery tasks). A receiver that fails is
logged; it never undoes or fails the change.
"""

import django.dispatch

event_recorded = django.dispatch.Signal()
