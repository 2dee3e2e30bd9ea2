"""Console forms: they parse and bound what people type; services check the domain rules."""
from __future__ import annotations

import shlex
from decimal import Decimal

from django import forms
from django.core.validators import MaxValueValidator

from marketplace.models import LeaseFailureReport
from marketplace.products.apikeys import SCOPE_SAID
from marketplace.products.catalog import SORTS
from marketplace.products.orders import ORDER_BOUNDS, max_duration_seconds
from marketplace.products.workloads import WORKLOAD_BOUNDS
from nodeagent.runtime.base import NOTICE_PATH

VERSION = r"^\d{1,3}(\.\d{1,3}){0,2}$"


UTC_FORMAT = "%Y-%m-%d %H:%M"


def utc_input() -> forms.DateTimeInput:
    """A time in UTC as the console writes times, 24-hour (2026-12-01 14:00), the same beside the calendar and in
    every locale: a browser's datetime-local picker would show the buyer's locale (12-hour in en-US)."""
    return forms.DateTimeInput(format=UTC_FORMAT, attrs={"placeholder": "2026-12-01 14:00", "inputmode": "numeric",
                                                          "autocomplete": "off", "size": 16,
                                                          "pattern": r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?"})
class NodeRenameForm(forms.Form):
    name = forms.CharField(label="Name", max_length=80, help_text="Unique among your nodes.")


class NodeRegisterForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="A name you will recognise, e.g. rack3-h100-01.")
    region = forms.CharField(max_length=40, initial="eu-west", help_text="Where the server is, e.g. eu-west, us-east.")
    price_per_gpu_hour = forms.DecimalField(label="Base price per whole GPU-hour (USD)", min_value=Decimal("0"),
                                            max_value=Decimal("1000"), decimal_places=4, initial=Decimal("2.00"))


class NodeSettingsForm(forms.Form):
    """A provider's terms for buyers' containers on a node (scheduler.services.nodes.node_settings_update)."""

    public_address = forms.CharField(label="Public address", max_length=255, required=False,
                                     help_text="Where buyers reach published ports, e.g. 203.0.113.7 (empty: the "
                                               "node's hostname).")
    port_range_start = forms.IntegerField(label="Host ports from", min_value=1024, max_value=65535)
    port_range_end = forms.IntegerField(label="to", min_value=1024, max_value=65535,
                                        help_text="Each exposed container port gets one; open them in the firewall.")
    cpus_per_gpu = forms.DecimalField(label="CPUs per GPU", min_value=Decimal("0.1"), max_value=Decimal("1024"),
                                      decimal_places=2, help_text="A slice's container gets its share.")
    ram_gb_per_gpu = forms.DecimalField(label="RAM (GB) per GPU", min_value=Decimal("0.25"),
                                        max_value=Decimal("65536"), decimal_places=2)
    image_allowlist = forms.CharField(label="Allowed images", required=False, max_length=16000,
                                      widget=forms.Textarea(attrs={"rows": 2,
                                                                   "placeholder": "docker.io/library/\nghcr.io/acme/"}),
                                      help_text="One reference prefix per line; empty: any image.")

    def clean_image_allowlist(self):
        return [line.strip() for line in self.cleaned_data["image_allowlist"].splitlines() if line.strip()]


class ApiKeyForm(forms.Form):
    name = forms.CharField(label="Key name", max_length=80, help_text="What uses it, e.g. ci-runner.")
    scopes = forms.MultipleChoiceField(label="What it may do", choices=[(s, f"{s}: {said}")
                                                                        for s, said in SCOPE_SAID.items()],
                                       widget=forms.CheckboxSelectMultiple,
                                       error_messages={"required": "Choose at least one scope."})

    def __init__(self, *args, default_scopes=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["scopes"].initial = list(default_scopes)


class SshKeyForm(forms.Form):
    name = forms.CharField(label="Key name", max_length=80, help_text="Which machine it is on, e.g. laptop.")
    public_key = forms.CharField(label="Public key", max_length=16384,
                                 widget=forms.Textarea(attrs={"rows": 2, "placeholder": "ssh-ed25519 AAAA… you@laptop"}),
                                 help_text="The contents of ~/.ssh/id_ed25519.pub (never the private key).")


class NotificationSettingsForm(forms.Form):
    webhook_url = forms.URLField(label="Webhook URL", max_length=300, required=False, assume_scheme="https",
                                 help_text="Market events are POSTed here as JSON (an order's own webhook wins). "
                                           "http(s) to a public address only.")
    interruption = forms.BooleanField(label="Spot interruption notices", required=False)
    lease_ended = forms.BooleanField(label="Lease ended", required=False)
    lease_failed = forms.BooleanField(label="Lease failed to start", required=False)
    balance_low = forms.BooleanField(label="Low balance", required=False)
    alerts = forms.BooleanField(label="Alerts (firing and resolved)", required=False)
    budget = forms.BooleanField(label="Budget cap and auto top-up", required=False)


class ProjectForm(forms.Form):
    name = forms.CharField(label="Project name", max_length=80)
    description = forms.CharField(max_length=400, required=False)


class AutoTopUpForm(forms.Form):
    """Auto top-up's settings (products.payments.auto_topup_configure checks them again)."""

    enabled = forms.BooleanField(label="Top up automatically", required=False)
    threshold = forms.DecimalField(label="When the wallet is under (USD)", max_digits=12, decimal_places=2,
                                   min_value=Decimal("0"), initial=Decimal("10.00"))
    amount = forms.DecimalField(label="Add (USD)", max_digits=12, decimal_places=2, min_value=Decimal("1.00"),
                                max_value=Decimal("10000.00"), initial=Decimal("50.00"))


class ProjectBudgetForm(forms.Form):
    """A project's monthly budget (products.projects.project_budget_set checks it again)."""

    monthly_budget = forms.DecimalField(label="Monthly budget (USD)", max_digits=12, decimal_places=2,
                                        min_value=Decimal("0.01"), required=False,
                                        help_text="Per UTC calendar month; leave empty for no budget.")
    budget_cap = forms.ChoiceField(label="At the budget", widget=forms.RadioSelect, initial="soft",
                                   choices=[("soft", "Soft cap — alerts only, nothing stops"),
                                            ("hard", "Hard cap — refuse new orders and end on-demand and spot "
                                                     "leases at the cap, with a notice before")])


def model_choices(blank: str = "any model") -> list[tuple[str, str]]:
    from scheduler.models import GpuModel

    return [("", blank)] + [(m.key, m.name) for m in GpuModel.objects.order_by("name")]


MODE_CHOICES = [("on_demand", "On demand"), ("reserved", "Reserved"), ("reserved_short_notice", "Reserved (< 1 h ahead)"),
                ("spot", "Spot"), ("resale", "Resale")]
SORT_CHOICES = [("price", "price, low first"), ("-pu_per_dollar", "PU per $, high first"),
                ("-availability", "availability, most first"), ("-reliability", "reliability, best first"),
                ("-memory_gb", "memory, most first"), ("-pu", "performance, most first")]
assert {s.lstrip("-") for s, _ in SORT_CHOICES} <= SORTS


class CatalogFilterForm(forms.Form):
    """Every filter of the catalog selector (marketplace.products.catalog.Filters)."""

    gpu_model = forms.ChoiceField(label="GPU model", required=False)
    min_memory_gb = forms.FloatField(label="Min memory (GB)", min_value=0, max_value=1000, required=False)
    min_cuda = forms.RegexField(VERSION, label="Min CUDA", required=False, error_messages={"invalid": "a version like 12.2"})
    min_compute_capability = forms.RegexField(VERSION, label="Min compute capability", required=False,
                                              error_messages={"invalid": "a version like 8.0"})
    region = forms.CharField(max_length=40, required=False)
    mode = forms.ChoiceField(label="Price mode", choices=MODE_CHOICES, required=False)
    max_price = forms.DecimalField(label="Max $/h", min_value=0, max_digits=12, decimal_places=6, required=False)
    min_reliability = forms.FloatField(label="Min reliability (0–1)", min_value=0, max_value=1, required=False)
    min_pu_per_dollar = forms.FloatField(label="Min PU per $", min_value=0, required=False)
    available = forms.BooleanField(label="Available now", required=False)
    ordering = forms.ChoiceField(label="Sort by", choices=SORT_CHOICES, required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_model"].choices = model_choices()


ORDER_MODES = [("on_demand", "On demand — per second, stop any time"),
               ("reserved", "Reserved — a booked window, paid now"),
               ("spot", "Spot — cheapest, interruptible, capped by your bid"),
               ("resale", "Resale — buy a listed window of someone's reservation")]


class SecretTextarea(forms.Textarea):
    """A textarea that never shows its value back (a form shown again with errors asks for the secrets again)."""

    def format_value(self, value):
        return None


class OrderForm(forms.Form):
    """One form for the four modes; fields that a mode does not use are ignored for it."""

    mode = forms.ChoiceField(choices=ORDER_MODES, widget=forms.RadioSelect, initial="on_demand")
    gpu_model = forms.ChoiceField(label="GPU model", required=False)
    memory_gb = forms.FloatField(label="Memory (GB)", min_value=ORDER_BOUNDS["memory_gb"][0],
                                 max_value=ORDER_BOUNDS["memory_gb"][1], required=False, initial=10,
                                 help_text="The smallest slice with at least this much memory is chosen.")
    compute_slices = forms.IntegerField(label="Compute slices", min_value=ORDER_BOUNDS["compute_slices"][0],
                                        max_value=ORDER_BOUNDS["compute_slices"][1], required=False, initial=1)
    whole_gpu = forms.BooleanField(label="Whole GPU", required=False)
    gpu_count = forms.IntegerField(label="GPUs", min_value=ORDER_BOUNDS["gpu_count"][0],
                                   max_value=ORDER_BOUNDS["gpu_count"][1], required=False, initial=1,
                                   help_text="On demand and spot: this many whole GPUs on one node (one lease "
                                             "each); tick Whole GPU.")
    region = forms.CharField(max_length=40, required=False, help_text="Empty: any region.")
    duration_hours = forms.DecimalField(label="Duration (hours)", min_value=Decimal("0.01"), decimal_places=2,
                                        required=False, initial=Decimal("1"),
                                        help_text="On demand and spot: the lease ends then (you can end it earlier).")
    window_start = forms.DateTimeField(label="Window start (UTC)", required=False, widget=utc_input(),
                                       help_text="Pick it on the calendar, or type it: 2026-12-01 14:00 (24-hour).")
    window_end = forms.DateTimeField(label="Window end (UTC)", required=False, widget=utc_input())
    max_price_per_hour = forms.DecimalField(label="Max price per hour (USD)",
                                            min_value=ORDER_BOUNDS["max_price_per_hour"][0],
                                            max_value=ORDER_BOUNDS["max_price_per_hour"][1], max_digits=12,
                                            decimal_places=6, required=False,
                                            help_text="On demand: a cap. Spot: your bid (required).")
    listing = forms.UUIDField(label="Resale listing", required=False, help_text="Pick one on the Resale page.")
    if_unavailable = forms.ChoiceField(label="If nothing is free", choices=[("fail", "refuse at once"),
                                                                           ("queue", "wait in the queue")],
                                       initial="fail", required=False)
    webhook_url = forms.URLField(label="Notification webhook (optional)", max_length=300, required=False,
                                 assume_scheme="https",
                                 help_text="This order's notices are POSTed here as JSON instead of your account's "
                                           "webhook (Account page).")
    project = forms.ChoiceField(label="Project", required=False,
                                help_text="Its usage and charges are grouped under this project on statements.")
    # What runs on it (products.workloads.WorkloadSpec): a template, any image, or nothing.
    workload = forms.ChoiceField(label="Run", required=False)
    image = forms.CharField(label="Image", max_length=300, required=False,
                            help_text="Any image the provider allows, e.g. docker.io/library/ubuntu:24.04; with a "
                                      "template, replaces its image.")
    kind = forms.ChoiceField(label="Kind", required=False, initial="interactive",
                             choices=[("interactive", "Interactive — runs for the lease"),
                                      ("job", "Job — runs to completion; billed only while it runs")])
    command = forms.CharField(label="Command", max_length=8000, required=False,
                              help_text="Replaces the image's command, e.g. python train.py --epochs 3 (a job's "
                                        "lease ends when it exits).")
    ports = forms.CharField(label="Ports", max_length=400, required=False,
                            help_text="Container ports to publish: 22/ssh, 8888/http, 9000/tcp, comma-separated "
                                      "(empty: the template's).")
    env = forms.CharField(label="Environment", required=False, max_length=64000,
                          widget=forms.Textarea(attrs={"rows": 2, "placeholder": "NAME=value, one per line"}))
    secret_env = forms.CharField(label="Secret environment", required=False, max_length=64000,
                                 widget=SecretTextarea(attrs={"rows": 2, "placeholder": "HF_TOKEN=hf_…",
                                                              "autocomplete": "off"}),
                                 help_text="Given to the container, never shown back, logged or sent to webhooks.")
    disk_gb = forms.IntegerField(label="Disk (GB)", min_value=WORKLOAD_BOUNDS["disk_gb"][0],
                                 max_value=WORKLOAD_BOUNDS["disk_gb"][1], required=False,
                                 help_text="Empty: the template's (20 GB for an image).")
    notice = forms.ChoiceField(label="Spot notice", required=False, initial="sigterm",
                               choices=[("sigterm", "SIGTERM at the notice"),
                                        ("file", f"a file at {NOTICE_PATH} to watch")])

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_model"].choices = model_choices()
        self.fields["workload"].choices = workload_choices()
        self.fields["workload"].initial = self.fields["workload"].choices[0][0]
        hours = self.fields["duration_hours"]
        hours.max_value = Decimal(max_duration_seconds()) / 3600
        hours.validators.append(MaxValueValidator(hours.max_value))
        hours.widget.attrs["max"] = str(hours.max_value)
        from marketplace.models import Project

        projects = Project.objects.filter(user=user).order_by("name") if user is not None else []
        self.fields["project"].choices = [("", "no project")] + [(str(p.pk), p.name) for p in projects]

    def clean(self):
        data = super().clean()
        mode = data.get("mode")
        if mode in ("on_demand", "spot") and not data.get("duration_hours") and not self.errors.get("duration_hours"):
            self.add_error("duration_hours", "How long do you need it? Give a duration in hours.")
        if mode == "reserved":
            for name in ("window_start", "window_end"):
                if not data.get(name) and not self.errors.get(name):
                    self.add_error(name, "A reservation needs a window: pick its start and end.")
        if (data.get("gpu_count") or 1) > 1 and mode in ("reserved", "resale") and not self.errors.get("gpu_count"):
            self.add_error("gpu_count", "Several GPUs are for on demand and spot orders; a reservation is one GPU "
                                        "or slice.")
        if mode == "spot" and not data.get("max_price_per_hour") and not self.errors.get("max_price_per_hour"):
            self.add_error("max_price_per_hour", "A spot order needs a bid: the most you pay per hour.")
        if mode == "resale" and not data.get("listing") and not self.errors.get("listing"):
            self.add_error("listing", "Choose the listing to buy (see the Resale page).")
        if data.get("workload") == "image" and not (data.get("image") or "").strip() and not self.errors.get("image"):
            self.add_error("image", "Which image? e.g. docker.io/library/ubuntu:24.04")
        for name in ("env", "secret_env"):
            try:
                data[f"{name}_pairs"] = env_pairs(data.get(name) or "")
            except ValueError as exc:
                self.add_error(name, str(exc))
        try:
            data["port_list"] = port_list(data.get("ports") or "")
        except ValueError as exc:
            self.add_error("ports", str(exc))
        try:
            data["command_args"] = shlex.split(data.get("command") or "")
        except ValueError:
            self.add_error("command", "A quote is not closed.")
        return data


def workload_choices() -> list[tuple[str, str]]:
    from marketplace.products.workloads import template_list

    return ([(t.key, t.name) for t in template_list()] + [("image", "An image of my choice"),
                                                           ("none", "Nothing: the slice only (for my own agent)")])


def env_pairs(text: str) -> list[tuple[str, str]]:
    """NAME=value lines (blank lines and # comments skipped) as pairs; ValueError naming a bad line."""
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"Line {n} is not NAME=value.")
        pairs.append((name.strip(), value))
    return pairs


def port_list(text: str) -> list[dict]:
    """"22/ssh, 8888/http, 9000/udp" as ports ({port, protocol, kind}); ValueError naming a bad one."""
    ports = []
    for item in filter(None, (x.strip() for x in text.replace(" ", ",").split(","))):
        number, _, how = item.partition("/")
        if not number.isdigit():
            raise ValueError(f"{item!r} is not PORT/ssh, PORT/http, PORT/tcp or PORT/udp.")
        how = how or "tcp"
        if how not in ("ssh", "http", "tcp", "udp"):
            raise ValueError(f"{item!r}: after the slash, ssh, http, tcp or udp.")
        ports.append({"port": int(number), "protocol": "udp" if how == "udp" else "tcp",
                      "kind": how if how in ("ssh", "http") else "tcp"})
    return ports


class ListForResaleForm(forms.Form):
    starts_at = forms.DateTimeField(label="From (UTC)", widget=utc_input())
    ends_at = forms.DateTimeField(label="Until (UTC)", widget=utc_input())
    ask_per_hour = forms.DecimalField(label="Ask per hour (USD)", min_value=Decimal("0"), max_digits=12, decimal_places=6)


class ResaleFilterForm(forms.Form):
    gpu_model = forms.ChoiceField(label="GPU model", required=False)
    region = forms.CharField(max_length=40, required=False)
    profile = forms.CharField(max_length=30, required=False)
    max_ask = forms.DecimalField(label="Max ask $/h", min_value=0, max_digits=12, decimal_places=6, required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_model"].choices = model_choices()


class TopUpForm(forms.Form):
    amount = forms.DecimalField(label="Amount (USD)", min_value=Decimal("1.00"), max_value=Decimal("10000.00"),
                                decimal_places=2, initial=Decimal("50.00"))


class PayoutRequestForm(forms.Form):
    amount = forms.DecimalField(label="Amount (USD)", min_value=Decimal("0.01"), decimal_places=2,
                                help_text="whole cents, up to what is payable now")


class LedgerFilterForm(forms.Form):
    kind = forms.ChoiceField(required=False, choices=[("", "all kinds"), ("topup", "top-ups"), ("usage", "usage"),
                                                      ("reservation", "reservations"), ("resale", "resale"),
                                                      ("refund", "refunds"), ("credit", "credits")])
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    project = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        from marketplace.models import Project

        self.fields["project"].choices = [("", "all projects")] + [
            (p.pk, p.name) for p in Project.objects.filter(user=user).order_by("name")]


class AlertRuleForm(forms.Form):
    """One alert rule in the console: the fields of every kind; only the kind's own are used (blank: the default)."""

    PARAMS = {"underused": ("util_below_percent", "minutes"), "oom_risk": ("memory_percent",), "gpu_health": (),
              "spend": ("percents",), "wallet_runway": ("hours",)}

    enabled = forms.BooleanField(label="On", required=False)
    email = forms.BooleanField(label="E-mail me", required=False)
    util_below_percent = forms.IntegerField(label="Utilisation below (%)", required=False, min_value=1, max_value=100)
    minutes = forms.IntegerField(label="for (minutes)", required=False, min_value=1, max_value=1440)
    memory_percent = forms.IntegerField(label="Memory at least (% of the slice)", required=False, min_value=50,
                                        max_value=100)
    percents = forms.CharField(label="At (% of the monthly budget)", required=False, max_length=60,
                               help_text="comma-separated, e.g. 50, 80, 100")
    hours = forms.IntegerField(label="Runs out within (hours)", required=False, min_value=1, max_value=720)

    def clean_percents(self):
        text = self.cleaned_data["percents"].strip()
        if not text:
            return None
        try:
            return [int(p) for p in text.replace(" ", "").split(",") if p]
        except ValueError:
            raise forms.ValidationError("whole percentages separated by commas, e.g. 50, 80, 100") from None

    def params_for(self, kind: str) -> dict:
        return {name: self.cleaned_data[name] for name in self.PARAMS[kind] if self.cleaned_data.get(name) is not None}
def _tco_decimal(label: str, *, low, high, places: int = 2, help_text: str = "") -> forms.DecimalField:
    return forms.DecimalField(label=label, min_value=Decimal(str(low)), max_value=Decimal(str(high)), max_digits=14,
                              decimal_places=places, required=False, help_text=help_text)


class TcoForm(forms.Form):
    """The TCO calculator's inputs (marketplace/products/tco.py); each left empty takes its default."""

    gpu_model = forms.ChoiceField(label="GPU model", required=False)
    gpus = forms.IntegerField(label="GPUs", min_value=1, max_value=10_000, required=False)
    pu_needed = _tco_decimal("Or performance units needed", low="0.1", high=10**6, places=1,
                             help_text="sets the GPUs: whole GPUs of the model, rounded up")
    hours_per_day = _tco_decimal("Hours a day", low="0.01", high=24)
    days = forms.IntegerField(label="Days", min_value=1, max_value=3650, required=False)
    utilisation = _tco_decimal("Expected utilisation (0–1)", low="0.01", high=1, places=4,
                               help_text="the share of the hours used that do useful work")
    hardware_price_per_gpu = _tco_decimal("Hardware price per GPU ($)", low=0, high=10**7)
    depreciation_months = forms.IntegerField(label="Depreciation (months)", min_value=1, max_value=240, required=False)
    power_watts_per_gpu = _tco_decimal("Power per GPU (W)", low=0, high=10_000, places=1)
    pue = _tco_decimal("PUE", low=1, high=5)
    usd_per_kwh = _tco_decimal("Electricity ($/kWh)", low=0, high=10, places=4)
    hosting_per_gpu_month = _tco_decimal("Hosting per GPU-month ($)", low=0, high=10**7)
    on_demand_per_gpu_hour = _tco_decimal("On demand ($/GPU-h)", low=0, high=10**7, places=6)
    reserved_per_gpu_hour = _tco_decimal("Reserved ($/GPU-h)", low=0, high=10**7, places=6)
    spot_per_gpu_hour = _tco_decimal("Spot ($/GPU-h)", low=0, high=10**7, places=6)
    spot_interruptions_per_hour = _tco_decimal("Spot interruptions per hour", low=0, high=100, places=4,
                                               help_text="default: this model's measured rate, last 30 days")
    rework_hours_per_interruption = _tco_decimal("Hours of work lost per interruption", low=0, high=100)
    mix_reserved_share = _tco_decimal("Mix: reserved share (0–1)", low=0, high=1, places=4)
    mix_spot_share = _tco_decimal("Mix: spot share (0–1)", low=0, high=1, places=4)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_model"].choices = model_choices(blank="your most used (else A100-80GB)")


class LeaseFailureReportForm(forms.Form):
    """A buyer's report that its lease failed on the provider's side (it counts against the node's reliability)."""

    reason = forms.ChoiceField(label="What went wrong", choices=LeaseFailureReport.Reason.choices)
    note = forms.CharField(label="Details (optional)", max_length=500, required=False,
                           widget=forms.Textarea(attrs={"rows": 2}))
