from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "Fleet and scheduling"
    default_auto_field = "django.db.models.BigAutoField"
