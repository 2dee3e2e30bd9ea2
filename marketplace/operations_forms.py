"""The console's forms of operations (docs/operations.md): an idle reclaim policy and an autoscaling rule. Their
bounds are the services' (marketplace/operations), which check them again for every caller."""
from __future__ import annotations

import zoneinfo

from django import forms

from marketplace.forms import model_choices
from marketplace.models import Mode, Template

TIMEZONES = sorted(zoneinfo.available_timezones() - {"localtime", "Factory"}) or ["UTC"]


class ReclaimPolicyForm(forms.Form):
    project = forms.TypedChoiceField(label="Applies to", coerce=lambda v: int(v) if v else None, empty_value=None,
                                     required=False, help_text="your default covers every lease whose project has "
                                                               "no policy of its own")
    idle_below_pct = forms.IntegerField(label="Idle below (%)", min_value=1, max_value=100, initial=5)
    idle_minutes = forms.IntegerField(label="For (minutes)", min_value=1, max_value=1440, initial=30)
    hours_start = forms.TimeField(label="Between", initial="22:00", widget=forms.TimeInput(attrs={"type": "time"}))
    hours_end = forms.TimeField(label="And", initial="07:00", widget=forms.TimeInput(attrs={"type": "time"}),
                                help_text="the same time twice: all day")
    timezone = forms.ChoiceField(label="Time zone", initial="UTC")
    grace_minutes = forms.IntegerField(label="Notice before ending (minutes)", min_value=0, max_value=1440,
                                       initial=10)
    hold_jobs = forms.BooleanField(label="Hold queued jobs in these hours", required=False, initial=True)
    enabled = forms.BooleanField(label="On", required=False, initial=True)

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [("", "all my leases (default)")] + [(p.pk, p.name) for p in projects]
        self.fields["timezone"].choices = [(z, z) for z in TIMEZONES]


class AutoscaleRuleForm(forms.Form):
    project = forms.TypedChoiceField(label="Project", coerce=int)
    name = forms.SlugField(label="Group name", max_length=40, help_text="letters, digits, - and _")
    template = forms.ChoiceField(label="Runs", required=False)
    mode = forms.ChoiceField(label="Mode", choices=[(Mode.ON_DEMAND, "On demand"), (Mode.SPOT, "Spot")])
    gpu_model = forms.ChoiceField(label="GPU model", required=False)
    whole_gpu = forms.BooleanField(label="Whole GPU", required=False)
    memory_gb = forms.FloatField(label="Memory (GB) at least", min_value=0, max_value=1000, initial=0)
    region = forms.CharField(label="Region", max_length=40, required=False)
    max_price_per_hour = forms.DecimalField(label="Bid / cap ($/h)", min_value=0, max_digits=12, decimal_places=6,
                                            required=False, help_text="a spot group's bid")
    min_leases = forms.IntegerField(label="Min leases", min_value=0, max_value=50, initial=1)
    max_leases = forms.IntegerField(label="Max leases", min_value=1, max_value=50, initial=4)
    scale_out_pct = forms.IntegerField(label="Scale out above (%)", min_value=1, max_value=100, initial=80)
    scale_out_minutes = forms.IntegerField(label="for (minutes)", min_value=1, max_value=1440, initial=5)
    scale_out_queue = forms.IntegerField(label="or a queue of", min_value=1, required=False,
                                         help_text="reported by the workload: POST /api/v1/autoscale-rules/{id}/queue/")
    scale_in_pct = forms.IntegerField(label="Scale in below (%)", min_value=0, max_value=99, initial=20)
    scale_in_minutes = forms.IntegerField(label="for (minutes)", min_value=1, max_value=1440, initial=15)
    scale_out_cooldown_seconds = forms.IntegerField(label="Scale-out cooldown (s)", min_value=0, max_value=86400,
                                                    initial=300)
    scale_in_cooldown_seconds = forms.IntegerField(label="Scale-in cooldown (s)", min_value=0, max_value=86400,
                                                   initial=600)
    enabled = forms.BooleanField(label="On", required=False, initial=True)

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [(p.pk, p.name) for p in projects]
        self.fields["template"].choices = [("", "nothing (hold the slice)")] + [
            (t.key, t.name) for t in Template.objects.filter(enabled=True)]
        self.fields["gpu_model"].choices = model_choices()

    def rule_fields(self) -> dict:
        """The service's fields of the cleaned form."""
        d = dict(self.cleaned_data)
        d.pop("project")
        model, region = d.pop("gpu_model"), d.pop("region").strip()
        return d | {"gpu_models": [model] if model else [], "regions": [region] if region else []}
