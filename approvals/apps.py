from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        from approvals import (
            receivers,  # noqa: F401  connects the signal
            tasks,  # noqa: F401  registers the tasks services send
        )
        from approvals.gatekeeper import ApprovalGatekeeper
        from runs.gates import register_gatekeeper

        # runs enforces the approval gate; approvals tells it which requests
        # are open and what their decisions resume with (runs.gates).
        register_gatekeeper(ApprovalGatekeeper())
