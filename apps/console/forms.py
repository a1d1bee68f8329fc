import uuid
from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from apps.broker import limits
from apps.broker.models import ConsumeFrom, TransactionState

SORTS = [
    ("born_at", "oldest first"),
    ("-born_at", "newest first"),
    ("-check_times", "most checked first"),
]


class TransactionFilterForm(forms.Form):
    state = forms.ChoiceField(
        choices=[("", "any state"), *TransactionState.choices], required=False
    )
    producer_group = forms.CharField(required=False, max_length=limits.MAX_NAME_CHARS)
    topic = forms.CharField(required=False, max_length=limits.MAX_NAME_CHARS)
    # Bounded like the API's (limits.MAX_INT): a 20-digit number is a form error, not an overflow.
    older_than_seconds = forms.IntegerField(
        required=False, min_value=0, max_value=limits.MAX_INT, label="older than (s)"
    )
    min_check_times = forms.IntegerField(
        required=False, min_value=0, max_value=limits.MAX_INT, label="checked at least"
    )
    query = forms.CharField(
        required=False, max_length=200, label="transaction id, message id or key"
    )
    order = forms.ChoiceField(choices=SORTS, required=False)


class ReasonForm(forms.Form):
    """An operator's reason for acting on transactions: the console's and the admin's."""

    reason = forms.CharField(
        max_length=limits.MAX_REASON_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Recorded with your user name in the transaction's history.",
    )


class ConfirmedReasonForm(ReasonForm):
    """The console's: the operator also confirms having checked the transaction."""

    confirm = forms.BooleanField(label="I have checked this transaction and want to go ahead.")


def _limit(check: Callable[..., Any], **kwargs: Any) -> Callable[[Any], None]:
    """A Django validator from one of apps.broker.limits' checks: the API's rules, not a copy."""

    def validate(value: Any) -> None:
        try:
            check(value, **kwargs)
        except limits.LimitError as error:
            raise ValidationError(str(error)) from None

    return validate


class NameField(forms.CharField):
    """A topic's or group's name, checked as typed: Django's strip would turn " orders" into a
    name the API refuses (docs/decisions/0114)."""

    def __init__(self, what: str, **kwargs: Any) -> None:
        super().__init__(
            max_length=limits.MAX_NAME_CHARS,
            strip=False,
            validators=[_limit(limits.check_name, what=what)],
            **kwargs,
        )


class TopicForm(forms.Form):
    name = NameField("name")
    queues = forms.IntegerField(
        min_value=limits.MIN_QUEUES, max_value=limits.MAX_QUEUES, initial=limits.DEFAULT_QUEUES
    )


class CheckUrlField(forms.URLField):
    """Django's URL check plus the API's (limits.check_url: a port in range, a usable host)."""

    def __init__(self, *, required: bool = True) -> None:
        super().__init__(
            max_length=limits.MAX_URL_CHARS,
            assume_scheme="https",
            validators=[_limit(limits.check_url)],
            required=required,
        )


class ProducerGroupForm(forms.Form):
    name = NameField("name")
    # Optional: a group of RocketMQ (gRPC) producers is checked over their Telemetry stream.
    check_url = CheckUrlField(required=False)


class CheckUrlForm(forms.Form):
    check_url = CheckUrlField()


class ConsumerGroupForm(forms.Form):
    name = NameField("name")
    max_delivery_attempts = forms.IntegerField(
        min_value=limits.MIN_DELIVERY_ATTEMPTS,
        max_value=limits.MAX_DELIVERY_ATTEMPTS,
        initial=limits.DEFAULT_DELIVERY_ATTEMPTS,
    )
    consume_from = forms.ChoiceField(choices=ConsumeFrom.choices, initial=ConsumeFrom.FIRST)
    fifo = forms.BooleanField(
        required=False,
        label="FIFO",
        help_text="Receive each message group's messages in order, one at a time (set once).",
    )


class ConsumerGroupEditForm(forms.Form):
    max_delivery_attempts = forms.IntegerField(
        min_value=limits.MIN_DELIVERY_ATTEMPTS, max_value=limits.MAX_DELIVERY_ATTEMPTS
    )


class ConsumerGroupDeleteForm(forms.Form):
    """A deletion cannot be undone: the group's name typed again confirms it (decision 0088)."""

    confirm = forms.CharField(max_length=limits.MAX_NAME_CHARS, label="Type the group's name")

    def __init__(self, *args: Any, group: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group

    def clean_confirm(self) -> str:
        typed: str = self.cleaned_data["confirm"]
        if typed != self.group:
            raise ValidationError("That is not this group's name: nothing was deleted.")
        return typed


class TopicBindingsForm(forms.Form):
    """A group's topic bindings, as the API's PUT .../topics takes them: the whole list."""

    topics = forms.CharField(
        max_length=20000,
        required=False,
        help_text="Space or comma separated topic names. Empty: the group may use any topic.",
    )

    def clean_topics(self) -> list[str]:
        names = [n for n in self.cleaned_data["topics"].replace(",", " ").split() if n]
        for name in names:
            _limit(limits.check_name, what="topic")(name)
        return names


class TokenForm(forms.Form):
    # Not stripped: a name with whitespace at either end is refused, as at every door (0114).
    name = forms.CharField(
        max_length=limits.MAX_NAME_CHARS,
        strip=False,
        validators=[_limit(limits.check_token_name)],
    )
    scopes = forms.CharField(
        max_length=4000,
        help_text="Space or comma separated: admin, produce:<producer group>, consume:<group>.",
    )

    def clean_scopes(self) -> list[str]:
        scopes = [s for s in self.cleaned_data["scopes"].replace(",", " ").split() if s]
        _limit(limits.check_scopes)(scopes)
        return scopes


class BulkActionForm(forms.Form):
    """The list page's bulk commit / roll back: the chosen ids, then a reason and a confirmation."""

    action = forms.ChoiceField(choices=[("commit", "Commit"), ("rollback", "Roll back")])
    ids = forms.TypedMultipleChoiceField(coerce=uuid.UUID, choices=[], required=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Any well-formed id is acceptable here; the service decides what each one allows.
        self.fields["ids"].valid_value = lambda value: _is_uuid(value)  # type: ignore[attr-defined]

    def clean_ids(self) -> list[uuid.UUID]:
        ids: list[uuid.UUID] = self.cleaned_data["ids"]
        _limit(limits.check_id_batch)(ids)  # REST's batch rule, before the confirmation page
        return ids


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
