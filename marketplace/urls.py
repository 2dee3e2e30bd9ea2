from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    # buyer
    path("catalog/", views.catalog, name="catalog"),
    path("catalog/<str:key>/", views.unit_detail, name="unit"),
    path("order/", views.order, name="order"),
    path("order/preview/", views.order_preview, name="order-preview"),
    path("orders/<uuid:order_id>/cancel/", views.order_cancel, name="order-cancel"),
    path("leases/", views.leases, name="leases"),
    path("leases/<uuid:lease_id>/", views.lease_detail, name="lease"),
    path("leases/<uuid:lease_id>/facts/", views.lease_facts, name="lease-facts"),
    path("leases/<uuid:lease_id>/end/", views.lease_end, name="lease-end"),
    path("leases/<uuid:lease_id>/logs/", views.lease_logs, name="lease-logs"),
    path("jobs/", views.jobs, name="jobs"),
    path("reservations/", views.reservations, name="reservations"),
    path("reservations/<uuid:reservation_id>/list/", views.list_for_resale, name="list-for-resale"),
    path("reservations/<uuid:reservation_id>/cancel/", views.reservation_cancel, name="reservation-cancel"),
    path("resale/", views.resale_market, name="resale"),
    path("resale/<uuid:listing_id>/buy/", views.resale_buy, name="resale-buy"),
    path("resale/<uuid:listing_id>/withdraw/", views.listing_cancel, name="listing-cancel"),
    path("billing/", views.billing, name="billing"),
    path("billing/balance/", views.balance_fragment, name="balance"),
    path("billing/topup/", views.topup, name="topup"),
    path("billing/statement.csv", views.statement_csv, name="statement-csv"),
    # provider
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/register/", views.node_register, name="node-register"),
    path("nodes/<uuid:node_id>/", views.node_detail, name="node"),
    path("nodes/<uuid:node_id>/gpus/", views.node_gpus_fragment, name="node-gpus"),
    path("nodes/<uuid:node_id>/gpus/<int:gpu_id>/health/", views.gpu_health, name="gpu-health"),
    path("nodes/<uuid:node_id>/drain/", views.node_drain, name="node-drain"),
    path("nodes/<uuid:node_id>/settings/", views.node_settings, name="node-settings"),
    path("earnings/", views.earnings, name="earnings"),
    path("earnings/payouts/", views.payout_request, name="payout-request"),
    path("earnings/payouts/<uuid:payout_id>/cancel/", views.payout_cancel, name="payout-cancel"),
    path("earnings/payout-account/", views.payout_account_connect, name="payout-account"),
    path("earnings/payout-account/refresh/", views.payout_account_refresh, name="payout-account-refresh"),
    path("earnings/payout-account/return/", views.payout_account_return, name="payout-account-return"),
    path("provider/", views.provider, name="provider"),
    path("nodes/<uuid:node_id>/rename/", views.node_rename, name="node-rename"),
    path("nodes/<uuid:node_id>/delete/", views.node_delete, name="node-delete"),
    # account
    path("account/", views.account, name="account"),
    path("account/two-factor/", views.two_factor, name="two-factor"),
    path("account/notifications/", views.notifications_save, name="notifications"),
    path("account/keys/", views.api_key_create, name="api-key-create"),
    path("account/keys/<uuid:key_id>/revoke/", views.api_key_revoke, name="api-key-revoke"),
    path("account/ssh-keys/", views.ssh_key_add, name="ssh-key-add"),
    path("account/ssh-keys/<int:key_id>/delete/", views.ssh_key_delete, name="ssh-key-delete"),
    path("account/projects/", views.project_create, name="project-create"),
    path("account/projects/<int:project_id>/delete/", views.project_delete, name="project-delete"),
    path("account/projects/<int:project_id>/", views.project_detail, name="project"),
]
