from django.urls import path

from webhooks.api import views

urlpatterns = [
    path("webhooks", views.SubscriptionListCreateView.as_view(), name="webhook-list"),
    path(
        "webhooks/<uuid:subscription_id>",
        views.SubscriptionDetailView.as_view(),
        name="webhook-detail",
    ),
    path(
        "webhooks/<uuid:subscription_id>/deliveries",
        views.DeliveryListView.as_view(),
        name="webhook-deliveries",
    ),
]
