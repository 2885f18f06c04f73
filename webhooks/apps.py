from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        from webhooks import receivers, tasks  # noqa: F401  connects and registers
        from webhooks.models import WebhookSubscription
        from webhooks.services import SUBSCRIPTIONS_EPOCH

        SUBSCRIPTIONS_EPOCH.watch(WebhookSubscription)
