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
        # A log-in that passed every factor (console, admin) forgets the account's failed log-ins before it.
        from django.contrib.auth.signals import user_logged_in

        from marketplace.products.accounts.logins import login_succeeded

        user_logged_in.connect(lambda sender, request, user, **kw: login_succeeded(user=user),
                               dispatch_uid="accounts.login_succeeded", weak=False)
