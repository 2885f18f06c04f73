from django.urls import path

from audit.api import views

urlpatterns = [
    path("events", views.AuditEventListView.as_view(), name="audit-events"),
    path(
        "threads/<str:thread_id>",
        views.ThreadTimelineView.as_view(),
        name="audit-thread-timeline",
    ),
    path("verify", views.VerifyView.as_view(), name="audit-verify"),
    path("head", views.HeadView.as_view(), name="audit-head"),
]
