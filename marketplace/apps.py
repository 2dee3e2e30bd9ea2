from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Market"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The fleet tells the market what happened to capacity through one port; the lifecycle answers.
        from marketplace.lifecycle.port import FleetFacts
        from scheduler.ports import register_market

        register_market(FleetFacts())
        # A flushed database (a test's) takes the accounts the ledger remembered the ids of.
        from django.db.models.signals import post_migrate

        from marketplace.money.ledger import forget_account_ids

        post_migrate.connect(forget_account_ids, dispatch_uid="ledger.forget_account_ids")
