from django.apps import AppConfig


class RetentionConfig(AppConfig):
    name = "retention"
    verbose_name = "Retention"

    def ready(self) -> None:
        from approvals.policy import register_policy_source
        from retention import tasks  # noqa: F401  registers the tasks services send
        from retention.models import RetentionPolicy

        # A tenant's approval due times and escalation chain are kept in its
        # retention policy; approvals reads them through this source.
        register_policy_source(
            lambda tenant: RetentionPolicy.for_tenant(tenant).approval_policy()
        )
