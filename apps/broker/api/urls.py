from django.urls import path

from apps.broker.api import (
    batch_views,
    converters,  # noqa: F401  (registers <name:>, <msgid:>, <rowid:>)
    registry_views,
    views,
)

urlpatterns = [
    path("topics", registry_views.TopicListView.as_view()),
    path("topics/<name:name>", registry_views.TopicDetailView.as_view()),
    path("topics/<name:topic>/messages", views.TopicMessagesView.as_view()),
    path("topics/<name:topic>/messages:batch", batch_views.SendBatchView.as_view()),
    path("producer-groups", registry_views.ProducerGroupListView.as_view()),
    path("producer-groups/<name:name>", registry_views.ProducerGroupDetailView.as_view()),
    path(
        "producer-groups/<name:name>/rotate-secret",
        registry_views.ProducerGroupRotateSecretView.as_view(),
    ),
    path("producer-groups/<name:name>/topics", registry_views.ProducerGroupTopicsView.as_view()),
    path("consumer-groups", registry_views.ConsumerGroupListView.as_view()),
    path("consumer-groups/<name:group>/topics", registry_views.ConsumerGroupTopicsView.as_view()),
    path("consumer-groups/<name:group>", views.ConsumerGroupDetailView.as_view()),
    path("consumer-groups/<name:group>/receive", views.ReceiveView.as_view()),
    path("consumer-groups/<name:group>/ack", views.AckView.as_view()),
    path("consumer-groups/<name:group>/change-invisible", views.ChangeInvisibleView.as_view()),
    path("consumer-groups/<name:group>/dlq", views.DlqListView.as_view()),
    path("consumer-groups/<name:group>/dlq/<msgid:msg_id>/resend", views.DlqResendView.as_view()),
    path("tokens", registry_views.TokenListView.as_view()),
    path("tokens/<rowid:token_id>", registry_views.TokenDetailView.as_view()),
    path("transactions", views.TransactionListView.as_view()),
    path("transactions:batch", batch_views.PrepareBatchView.as_view()),
    path("transactions:commit", batch_views.CommitBatchView.as_view()),
    path("transactions:rollback", batch_views.RollbackBatchView.as_view()),
    path("transactions/<uuid:transaction_id>", views.TransactionDetailView.as_view()),
    path("transactions/<uuid:transaction_id>/commit", views.TransactionCommitView.as_view()),
    path("transactions/<uuid:transaction_id>/rollback", views.TransactionRollbackView.as_view()),
    path("transactions/<uuid:transaction_id>/resume", views.TransactionResumeView.as_view()),
    path("messages/<msgid:msg_id>", views.MessageDetailView.as_view()),
    path("messages/<msgid:msg_id>/recall", views.MessageRecallView.as_view()),
    path("reconciliations", registry_views.ReconciliationListView.as_view()),
    path("reconciliations/<rowid:run_id>", registry_views.ReconciliationDetailView.as_view()),
]
