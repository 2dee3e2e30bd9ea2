from decimal import Decimal

from django import forms


class NodeRegisterForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="A name you will recognise, e.g. rack3-h100-01.")
    region = forms.CharField(max_length=40, initial="eu-west", help_text="Where the server is, e.g. eu-west, us-east.")
    price_per_gpu_hour = forms.DecimalField(label="Base price per whole GPU-hour (USD)", min_value=Decimal("0"),
                                            max_value=Decimal("1000"), decimal_places=4, initial=Decimal("2.00"))


class ApiKeyForm(forms.Form):
    name = forms.CharField(label="Key name", max_length=80, help_text="What uses it, e.g. ci-runner.")


class ProjectForm(forms.Form):
    name = forms.CharField(label="Project name", max_length=80)
    description = forms.CharField(max_length=400, required=False)
