from django import forms

from apps.broker.models import TransactionState

SORTS = [
    ("born_at", "oldest first"),
    ("-born_at", "newest first"),
    ("-check_times", "most checked first"),
]


class TransactionFilterForm(forms.Form):
    state = forms.ChoiceField(
        choices=[("", "any state"), *TransactionState.choices], required=False
    )
    producer_group = forms.CharField(required=False, max_length=127)
    topic = forms.CharField(required=False, max_length=127)
    older_than_seconds = forms.IntegerField(required=False, min_value=0, label="older than (s)")
    min_check_times = forms.IntegerField(required=False, min_value=0, label="checked at least")
    query = forms.CharField(
        required=False, max_length=200, label="transaction id, message id or key"
    )
    order = forms.ChoiceField(choices=SORTS, required=False)


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Recorded with your user name in the transaction's history.",
    )
    confirm = forms.BooleanField(label="I have checked this transaction and want to go ahead.")
