from django.urls import path

from approvals.api import views

urlpatterns = [
    path("approvals", views.ApprovalListView.as_view(), name="approval-list"),
    path(
        "approvals/<uuid:approval_id>",
        views.ApprovalDetailView.as_view(),
        name="approval-detail",
    ),
    path(
        "approvals/<uuid:approval_id>/decision",
        views.ApprovalDecisionView.as_view(),
        name="approval-decision",
    ),
]
