from django.contrib.auth import views as auth_views
from django.urls import path

from apps.console import views

app_name = "console"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("transactions/", views.transaction_list, name="transactions"),
    path(
        "transactions/<uuid:transaction_id>/", views.transaction_detail, name="transaction-detail"
    ),
    path(
        "transactions/<uuid:transaction_id>/body", views.transaction_body, name="transaction-body"
    ),
    path(
        "transactions/<uuid:transaction_id>/<str:action>/",
        views.transaction_action,
        name="transaction-action",
    ),
]
