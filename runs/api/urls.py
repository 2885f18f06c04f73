from django.urls import path

from runs.api import views

urlpatterns = [
    path("agents", views.AgentListView.as_view(), name="agent-list"),
    path("threads", views.ThreadListCreateView.as_view(), name="thread-list"),
    # threads/<thread_id> (GET, DELETE) is routed by retention, whose view adds
    # DELETE to runs' ThreadDetailView: runs does not import retention.
    path(
        "threads/<str:thread_id>/runs",
        views.RunListCreateView.as_view(),
        name="run-list",
    ),
    path(
        "threads/<str:thread_id>/runs/<uuid:run_id>",
        views.RunDetailView.as_view(),
        name="run-detail",
    ),
    path(
        "threads/<str:thread_id>/resume",
        views.ResumeView.as_view(),
        name="thread-resume",
    ),
    path(
        "threads/<str:thread_id>/state", views.StateView.as_view(), name="thread-state"
    ),
    path(
        "threads/<str:thread_id>/state/<str:checkpoint_id>",
        views.StateAtCheckpointView.as_view(),
        name="thread-state-at",
    ),
    path(
        "threads/<str:thread_id>/history",
        views.HistoryView.as_view(),
        name="thread-history",
    ),
    path("threads/<str:thread_id>/fork", views.ForkView.as_view(), name="thread-fork"),
]
