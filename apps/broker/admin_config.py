"""Django's admin app with the project's site (apps/broker/admin_site.py; docs/decisions/0103)."""

from django.contrib.admin.apps import AdminConfig


class TxhubAdminConfig(AdminConfig):
    default_site = "apps.broker.admin_site.TxhubAdminSite"
