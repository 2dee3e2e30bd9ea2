from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Market"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The fleet announces slice and node changes; the market follows its leases from them.
        from marketplace.services import receivers  # noqa: F401
