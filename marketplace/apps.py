from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Market"
    default_auto_field = "django.db.models.BigAutoField"
