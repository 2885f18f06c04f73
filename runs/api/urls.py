from django.urls import path

from runs.api import views

urlpatterns = [
    path("agents", views.AgentListView.as_view(), name="agent-list"),
]
