from django.apps import AppConfig


class RetentionConfig(AppConfig):
    name = "retention"
    verbose_name = "Retention"

    def ready(self) -> None:
        from retention import tasks  # noqa: F401  registers the tasks services send
