from django.urls import path

from retention.api import views

urlpatterns = [
    path(
        "threads/<str:thread_id>",
        views.ThreadDetailDeleteView.as_view(),
        name="thread-detail",
    ),
    path(
        "deletion-requests",
        views.DeletionRequestListCreateView.as_view(),
        name="deletion-request-list",
    ),
    path(
        "deletion-requests/<uuid:request_id>",
        views.DeletionRequestDetailView.as_view(),
        name="deletion-request-detail",
    ),
]
