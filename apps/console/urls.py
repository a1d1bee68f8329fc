from django.contrib.auth import views as auth_views
from django.urls import path

from apps.broker.api import converters  # noqa: F401  (registers <name:>, <msgid:>, <rowid:>)
from apps.console import registry_views as setup
from apps.console import views

app_name = "console"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("transactions/", views.transaction_list, name="transactions"),
    path("transactions/bulk/", views.transaction_bulk_action, name="transactions-bulk"),
    path("delayed/", views.delayed_list, name="delayed"),
    path("audit/", views.audit_list, name="audit"),
    path("reconciliations/", views.reconciliation_list, name="reconciliations"),
    path("reconciliations/<rowid:run_id>/", views.reconciliation_detail, name="reconciliation"),
    path("topics/", setup.topic_list, name="topics"),
    path("topics/new/", setup.topic_create, name="topic-create"),
    path("producer-groups/", setup.producer_group_list, name="producer-groups"),
    path("producer-groups/new/", setup.producer_group_create, name="producer-group-create"),
    path(
        "producer-groups/<name:name>/edit/", setup.producer_group_edit, name="producer-group-edit"
    ),
    path(
        "producer-groups/<name:name>/topics/",
        setup.producer_group_topics,
        name="producer-group-topics",
    ),
    path(
        "producer-groups/<name:name>/rotate-secret/",
        setup.producer_group_rotate,
        name="producer-group-rotate",
    ),
    path(
        "producer-groups/<name:name>/test-callback/",
        setup.producer_group_test,
        name="producer-group-test",
    ),
    path("consumer-groups/", setup.consumer_group_list, name="consumer-groups"),
    path("consumer-groups/new/", setup.consumer_group_create, name="consumer-group-create"),
    path("consumer-groups/<name:name>/", setup.consumer_group_detail, name="consumer-group"),
    path(
        "consumer-groups/<name:name>/edit/", setup.consumer_group_edit, name="consumer-group-edit"
    ),
    path(
        "consumer-groups/<name:name>/delete/",
        setup.consumer_group_delete,
        name="consumer-group-delete",
    ),
    path(
        "consumer-groups/<name:name>/topics/",
        setup.consumer_group_topics,
        name="consumer-group-topics",
    ),
    path(
        "consumer-groups/<name:name>/dlq/<msgid:msg_id>/resend/",
        setup.dlq_resend,
        name="dlq-resend",
    ),
    path("tokens/", setup.token_list, name="tokens"),
    path("tokens/new/", setup.token_create, name="token-create"),
    path("tokens/<rowid:token_id>/revoke/", setup.token_revoke, name="token-revoke"),
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
