from django.urls import path

from apps.broker.api import views

urlpatterns = [
    path("topics", views.TopicListView.as_view()),
    path("topics/<str:name>", views.TopicDetailView.as_view()),
    path("topics/<str:topic>/messages", views.TopicMessagesView.as_view()),
    path("producer-groups", views.ProducerGroupListView.as_view()),
    path("producer-groups/<str:name>", views.ProducerGroupDetailView.as_view()),
    path("producer-groups/<str:name>/rotate-secret", views.ProducerGroupRotateSecretView.as_view()),
    path("producer-groups/<str:name>/topics", views.ProducerGroupTopicsView.as_view()),
    path("consumer-groups", views.ConsumerGroupListView.as_view()),
    path("consumer-groups/<str:group>/topics", views.ConsumerGroupTopicsView.as_view()),
    path("consumer-groups/<str:group>", views.ConsumerGroupDetailView.as_view()),
    path("consumer-groups/<str:group>/receive", views.ReceiveView.as_view()),
    path("consumer-groups/<str:group>/ack", views.AckView.as_view()),
    path("consumer-groups/<str:group>/change-invisible", views.ChangeInvisibleView.as_view()),
    path("consumer-groups/<str:group>/dlq", views.DlqListView.as_view()),
    path("consumer-groups/<str:group>/dlq/<str:msg_id>/resend", views.DlqResendView.as_view()),
    path("tokens", views.TokenListView.as_view()),
    path("tokens/<int:token_id>", views.TokenDetailView.as_view()),
    path("transactions", views.TransactionListView.as_view()),
    path("transactions/<uuid:transaction_id>", views.TransactionDetailView.as_view()),
    path("transactions/<uuid:transaction_id>/commit", views.TransactionCommitView.as_view()),
    path("transactions/<uuid:transaction_id>/rollback", views.TransactionRollbackView.as_view()),
    path("transactions/<uuid:transaction_id>/resume", views.TransactionResumeView.as_view()),
    path("messages/<str:msg_id>", views.MessageDetailView.as_view()),
    path("reconciliations", views.ReconciliationListView.as_view()),
    path("reconciliations/<int:run_id>", views.ReconciliationDetailView.as_view()),
]
