from django.contrib import admin
from django.contrib.auth import get_user_model

from marketplace.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request, queryset):
        from marketplace.products.apikeys import api_key_revoke

        keys = list(queryset.filter(revoked_at__isnull=True).values_list("pk", "user_id"))
        for pk, user_id in keys:
            api_key_revoke(user=get_user_model()(pk=user_id), key_id=pk)
        self.message_user(request, f"{len(keys)} key(s) revoked.")


# --- Money: the ledger is append-only, so its admin is read-only; payments can be refunded. -------------
from django.contrib import messages  # noqa: E402

from marketplace.models import (Account, LedgerCheck, LedgerEntry, LedgerTransaction, Payment,  # noqa: E402
                                Project, StripeEvent, UsageRecord)
from scheduler.errors import DomainError  # noqa: E402


class ReadOnlyAdmin(admin.ModelAdmin):
    """Money is moved by services only (balanced, locked, idempotent); the admin looks, never edits."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "created_at"]
    search_fields = ["name", "user__username"]
    readonly_fields = ["created_at"]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["kind", "user", "balance", "currency", "created_at"]
    list_filter = ["kind"]
    search_fields = ["user__username"]


class LedgerEntryInline(admin.TabularInline):
    model = LedgerEntry
    fields = ["account", "amount", "project", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "kind", "memo", "project", "lease_id", "order_id"]
    list_filter = ["kind"]
    search_fields = ["memo", "idempotency_key", "=lease_id", "=order_id"]
    inlines = [LedgerEntryInline]
    date_hierarchy = "created_at"


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "account", "amount", "project", "transaction"]
    list_filter = ["account__kind"]
    search_fields = ["account__user__username", "transaction__memo"]
    list_select_related = ["account", "account__user", "transaction"]


@admin.register(LedgerCheck)
class LedgerCheckAdmin(ReadOnlyAdmin):
    """Reconciliations of the ledger (beat, every MARKET_LEDGER_CHECK_SECONDS); "Check now" runs one."""

    list_display = ["ran_at", "ok", "problem_count", "accounts", "entries", "seconds"]
    list_filter = ["ok"]
    readonly_fields = ["ran_at", "ok", "problems", "accounts", "entries", "seconds"]
    actions = ["check_now"]

    @admin.display(description="problems")
    def problem_count(self, obj: LedgerCheck) -> int:
        return len(obj.problems)

    @admin.action(description="Check the ledger now")
    def check_now(self, request, queryset):
        from marketplace.money.check import ledger_check_run

        check = ledger_check_run()
        level = messages.SUCCESS if check.ok else messages.ERROR
        self.message_user(request, str(check) + ("" if check.ok else f": {check.problems[0]}"), level)

    def changelist_view(self, request, extra_context=None):
        latest = LedgerCheck.objects.first()
        if latest is not None and not latest.ok:
            self.message_user(request, f"The last ledger check found {len(latest.problems)} problems: "
                                       f"{latest.problems[0]}", messages.ERROR)
        return super().changelist_view(request, extra_context)


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "user", "amount", "refunded_amount", "status", "stripe_payment_intent_id",
                    "decline_code"]
    list_filter = ["status"]
    search_fields = ["stripe_payment_intent_id", "user__username"]
    actions = ["refund"]

    @admin.action(description="Refund the unspent part to the card", permissions=["refund"])
    def refund(self, request, queryset):
        from marketplace.products.payments import payment_refund

        for payment in queryset:
            try:
                payment_refund(payment_id=payment.pk, unspent_only=True)
                self.message_user(request, f"refunded {payment}", messages.SUCCESS)
            except DomainError as exc:
                self.message_user(request, f"{payment}: {exc.message}", messages.ERROR)

    def has_refund_permission(self, request):
        # Refunding sends money out: superusers, or staff granted "change payment" explicitly.
        return request.user.is_superuser or request.user.has_perm("marketplace.change_payment")


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["received_at", "event_id", "type", "processed"]
    list_filter = ["type", "processed"]
    search_fields = ["event_id"]


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = ["minute", "lease_id", "buyer", "provider", "project", "gpu_model", "profile", "seconds", "amount"]
    list_filter = ["gpu_model", "mode"]
    search_fields = ["=lease_id", "buyer__username", "provider__username"]
    list_select_related = ["buyer", "provider", "project"]
    date_hierarchy = "minute"


from marketplace.models import LeaseFailureReport  # noqa: E402


@admin.register(LeaseFailureReport)
class LeaseFailureReportAdmin(ReadOnlyAdmin):
    """Buyers' reports of failed leases: they count against the node's and GPU's reliability score."""

    list_display = ["created_at", "lease", "reason", "node_id", "gpu_id", "note"]
    list_filter = ["reason"]
    search_fields = ["=lease__id", "=node_id", "note"]
    date_hierarchy = "created_at"


# --- Provider payouts: operators approve (the transfer follows) or reject requests; nothing is edited by hand. ---
from django.template.response import TemplateResponse  # noqa: E402

from marketplace.models import Payout  # noqa: E402


@admin.register(Payout)
class PayoutAdmin(ReadOnlyAdmin):
    list_display = ["requested_at", "provider", "amount", "state", "decided_by", "decided_at", "transfer",
                    "failure_reason", "last_error"]
    list_filter = ["state", "simulated"]
    search_fields = ["=id", "provider__username", "transfer_id"]
    list_select_related = ["provider", "decided_by"]
    date_hierarchy = "requested_at"
    actions = ["approve", "reject", "send_again"]

    @admin.display(description="transfer")
    def transfer(self, obj: Payout) -> str:
        if obj.simulated:
            return "simulated transfer (demo: no Stripe Connect)"
        return obj.transfer_id or "—"

    def has_pay_permission(self, request) -> bool:
        # Approving sends money out: superusers, or staff granted "change payout" explicitly.
        return request.user.is_superuser or request.user.has_perm("marketplace.change_payout")

    @admin.action(description="Approve and pay the selected requests", permissions=["pay"])
    def approve(self, request, queryset):
        from marketplace.products.payouts import payout_approve

        for payout in queryset.order_by("requested_at"):
            try:
                done = payout_approve(payout_id=payout.pk, by=request.user)
            except DomainError as exc:
                self.message_user(request, f"{payout}: {exc.message}", messages.ERROR)
                continue
            if done.state == Payout.State.PAID:
                self.message_user(request, f"{done}: paid by {self.transfer(done)}.", messages.SUCCESS)
            elif done.state == Payout.State.FAILED:
                self.message_user(request, f"{done}: {done.failure_reason}", messages.ERROR)
            else:
                self.message_user(request, f"{done}: approved, but the transfer did not go through "
                                           f"({done.last_error}); it is sent again automatically.", messages.WARNING)

    @admin.action(description="Reject the selected requests…", permissions=["pay"])
    def reject(self, request, queryset):
        """Asks for the reason (the provider reads it) on a page of its own, then rejects."""
        from marketplace.products.payouts import payout_reject

        if request.POST.get("confirm") != "yes":
            return TemplateResponse(request, "admin/marketplace/payout/reject.html", {
                **self.admin_site.each_context(request), "title": "Reject payout requests", "payouts": queryset,
                "opts": self.model._meta, "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME})
        note = (request.POST.get("note") or "").strip()
        for payout in queryset:
            try:
                payout_reject(payout_id=payout.pk, by=request.user, note=note)
            except DomainError as exc:
                self.message_user(request, f"{payout}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{payout}: rejected.", messages.SUCCESS)
        return None

    @admin.action(description="Send the transfer of the selected approved payouts again", permissions=["pay"])
    def send_again(self, request, queryset):
        from marketplace.products.payouts import payout_send

        for payout in queryset.filter(state=Payout.State.APPROVED):
            done = payout_send(payout_id=payout.pk)
            level = {Payout.State.PAID: messages.SUCCESS, Payout.State.FAILED: messages.ERROR}.get(done.state,
                                                                                                  messages.WARNING)
            self.message_user(request, f"{done}: {done.failure_reason or done.last_error or 'paid'}", level)


# --- The market: orders, leases, reservations, spot, resale, interruptions. --------------------------------
from marketplace.models import (Interruption, Lease, Order, Reservation, ResaleListing, SpotBid,  # noqa: E402
                                SpotPrice)


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "buyer", "mode", "state", "priority", "price_per_hour", "total_price", "attempts",
                    "created_at", "placed_at", "explain"]
    list_filter = ["mode", "state", "if_unavailable"]
    search_fields = ["id", "buyer__username"]
    readonly_fields = [f.name for f in Order._meta.fields]
    actions = ["cancel_orders"]

    @admin.action(description="Cancel the selected orders (queued: cancelled; placed on demand/spot: lease ended)")
    def cancel_orders(self, request, queryset):
        from marketplace.products.orders import order_cancel

        done = 0
        for order in queryset:
            try:
                order_cancel(buyer=order.buyer, order_id=order.pk)
                done += 1
            except DomainError as exc:
                self.message_user(request, f"{order}: {exc.message}", messages.WARNING)
        self.message_user(request, f"cancelled {done} orders")


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["id", "buyer", "mode", "state", "slice", "price_per_hour", "cost_charged", "started_at",
                    "ends_at", "ended_at", "end_reason"]
    list_filter = ["mode", "state", "end_reason"]
    search_fields = ["id", "buyer__username", "slice__instance_uuid"]
    list_select_related = ["buyer", "slice__gpu__node"]
    readonly_fields = [f.name for f in Lease._meta.fields]
    actions = ["end_leases"]

    @admin.action(description="End the selected leases (billing stops now, the instance is destroyed)")
    def end_leases(self, request, queryset):
        from marketplace.lifecycle.leases import lease_end

        for lease in queryset:
            lease_end(lease_id=lease.pk, reason="ended by an operator")
        self.message_user(request, f"ended {queryset.count()} leases")


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ["id", "holder", "gpu", "profile", "slot_start", "starts_at", "ends_at", "price_total", "state"]
    list_filter = ["state", "profile"]
    search_fields = ["id", "holder__username", "gpu__uuid"]
    list_select_related = ["holder", "gpu__node"]
    readonly_fields = [f.name for f in Reservation._meta.fields]


@admin.register(SpotBid)
class SpotBidAdmin(admin.ModelAdmin):
    list_display = ["id", "buyer", "max_price_per_hour", "state", "created_at"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in SpotBid._meta.fields]


@admin.register(SpotPrice)
class SpotPriceAdmin(ReadOnlyAdmin):
    list_display = ["gpu_model", "at", "factor", "free_share", "price_per_gpu_hour"]
    list_filter = ["gpu_model"]


@admin.register(ResaleListing)
class ResaleListingAdmin(admin.ModelAdmin):
    list_display = ["id", "seller", "gpu_model", "profile", "region", "starts_at", "ends_at", "ask_per_hour",
                    "state", "buyer", "fee"]
    list_filter = ["state", "gpu_model", "region"]
    search_fields = ["id", "seller__username", "buyer__username"]
    list_select_related = ["seller", "buyer"]
    readonly_fields = [f.name for f in ResaleListing._meta.fields]
    actions = ["withdraw"]

    @admin.action(description="Withdraw the selected open listings")
    def withdraw(self, request, queryset):
        from marketplace.products.resale import listing_cancel

        done = 0
        for listing in queryset.filter(state=ResaleListing.State.OPEN).select_related("seller"):
            try:
                listing_cancel(seller=listing.seller, listing_id=listing.pk)
                done += 1
            except DomainError as exc:
                self.message_user(request, f"{listing.pk}: {exc.message}", level=messages.ERROR)
        self.message_user(request, f"{done} listing(s) withdrawn.")


@admin.register(Interruption)
class InterruptionAdmin(ReadOnlyAdmin):
    list_display = ["lease", "kind", "announced_at", "deadline", "notice_seconds", "credited", "gpu_model", "region"]
    list_filter = ["kind", "gpu_model", "region"]


# --- Workloads: operators curate templates; buyers' workloads and containers are looked at, never edited. ------
from django import forms  # noqa: E402

from marketplace.models import PortBinding, SshKey, Template, Workload, WorkloadRun  # noqa: E402


class TemplateForm(forms.ModelForm):
    class Meta:
        model = Template
        fields = "__all__"

    def clean(self):
        """A template is checked as an order's workload would be (image, ports, environment, kind)."""
        from marketplace.products.workloads import WorkloadSpec, workload_resolve

        data = super().clean()
        env = data.get("env") or {}
        if not isinstance(env, dict):
            raise forms.ValidationError({"env": "names to values, e.g. {\"JUPYTER_ENABLE_LAB\": \"yes\"}"})
        try:
            workload_resolve(WorkloadSpec(image=data.get("image") or "", command=data.get("command") or [],
                                          args=data.get("args") or [], ports=data.get("ports") or [],
                                          env=[{"name": k, "value": str(v)} for k, v in env.items()],
                                          disk_gb=data.get("disk_gb"), kind=data.get("kind")))
        except DomainError as exc:
            raise forms.ValidationError({exc.field.removeprefix("workload."): exc.message}) from None
        return data


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin):
    form = TemplateForm
    list_display = ["name", "key", "image", "kind", "jupyter", "enabled", "position"]
    list_editable = ["enabled", "position"]
    search_fields = ["name", "key", "image"]


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "fingerprint", "created_at"]
    search_fields = ["name", "fingerprint", "user__username"]
    readonly_fields = ["user", "name", "public_key", "fingerprint", "created_at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Workload)
class WorkloadAdmin(ReadOnlyAdmin):
    list_display = ["order", "kind", "image", "template"]
    list_filter = ["kind", "template"]
    search_fields = ["image", "order__id"]
    # the environment as it may be shown: secret values masked
    fields = ["order", "template", "image", "command", "args", "env_shown", "ports", "disk_gb", "kind", "notice"]
    readonly_fields = fields

    @admin.display(description="env")
    def env_shown(self, obj):
        return obj.public_env()


class PortBindingInline(admin.TabularInline):
    model = PortBinding
    extra = 0
    fields = ["node", "host_port", "container_port", "protocol", "kind"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(WorkloadRun)
class WorkloadRunAdmin(ReadOnlyAdmin):
    list_display = ["lease", "state", "exit_code", "started_at", "finished_at", "updated_at"]
    list_filter = ["state"]
    search_fields = ["lease__id", "container"]
    readonly_fields = ["lease", "state", "container", "progress", "error", "exit_code", "started_at",
                       "finished_at", "log_bytes", "log_tail"]
    inlines = [PortBindingInline]


from marketplace.models import AccountSecurity, ProviderProfile  # noqa: E402
from marketplace.products.accounts.logins import lock_clear  # noqa: E402


@admin.register(ProviderProfile)
class ProviderProfileAdmin(admin.ModelAdmin):
    list_display = ["display_name", "user", "payout_country", "terms_version", "terms_accepted_at", "stripe_account_id"]
    list_filter = ["payout_country", "terms_version"]
    search_fields = ["display_name", "user__username", "user__email"]
    list_select_related = ["user"]
    readonly_fields = ["user", "terms_version", "terms_accepted_at", "created_at"]


@admin.register(AccountSecurity)
class AccountSecurityAdmin(admin.ModelAdmin):
    """E-mail confirmation and lock-out of each account; an operator can lift a lock."""

    list_display = ["user", "signed_up_at", "email_confirmed_at", "failures", "locked_until", "last_failure_address"]
    list_filter = ["email_confirmed_at", "locked_until"]
    search_fields = ["user__username", "user__email", "last_failure_address"]
    list_select_related = ["user"]
    readonly_fields = [f.name for f in AccountSecurity._meta.fields]
    actions = ["unlock"]

    @admin.action(description="Lift the lock-out of the selected accounts")
    def unlock(self, request, queryset):
        for row in queryset.select_related("user"):
            lock_clear(user=row.user)
        self.message_user(request, f"{queryset.count()} account(s) unlocked", messages.SUCCESS)


from django.contrib.auth.admin import UserAdmin  # noqa: E402
from django.contrib.auth.forms import UserChangeForm  # noqa: E402
from django.core.exceptions import ValidationError  # noqa: E402


class OneAccountPerEmailForm(UserChangeForm):
    """E-mail addresses are unique whatever their case (a unique index decides): said beside the field, not a 500."""

    def clean_email(self):
        email = self.cleaned_data.get("email", "")
        if email and get_user_model().objects.filter(email__iexact=email).exclude(pk=self.instance.pk).exists():
            raise ValidationError("Another account has this e-mail address.")
        return email


class AccountUserAdmin(UserAdmin):
    form = OneAccountPerEmailForm


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), AccountUserAdmin)


# --- alerts (docs/operations.md "Alerts"): operators look; users change their rules in the console or the API ------
from marketplace.models import Alert, AlertRule  # noqa: E402


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["fired_at", "user", "kind", "severity", "state", "title", "resolved_at"]
    list_filter = ["state", "kind", "severity"]
    search_fields = ["user__username", "subject_key", "title"]
    date_hierarchy = "fired_at"


@admin.register(AlertRule)
class AlertRuleAdmin(ReadOnlyAdmin):
    list_display = ["user", "kind", "project", "lease", "params", "enabled", "email", "updated_at"]
    list_filter = ["kind", "enabled"]
    search_fields = ["user__username"]
