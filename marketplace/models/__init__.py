"""Market models, split by domain: accounts (API keys), billing (money), market (orders, leases, ...)."""
from .accounts import AccountSecurity, ApiKey, NotificationSettings, ProviderProfile
from .billing import (Account, AutoTopUp, BudgetNotice, LedgerCheck, LedgerEntry, LedgerTransaction, Payment, Project, StripeEvent,
                      UsageRecord)

__all__ = ["AccountSecurity", "ApiKey", "NotificationSettings", "ProviderProfile"]
__all__ += ["Account", "AutoTopUp", "BudgetNotice", "LedgerCheck", "LedgerEntry", "LedgerTransaction", "Payment", "Project", "StripeEvent", "UsageRecord"]
from .market import (Interruption, Lease, LeaseFailureReport, Mode, Order, Reservation, ResaleListing, SpotBid,  # noqa: E402
                     SpotPrice)

__all__ += ["Interruption", "Lease", "LeaseFailureReport", "Mode", "Order", "Reservation", "ResaleListing", "SpotBid", "SpotPrice"]
from .workloads import PortBinding, SshKey, Template, Workload, WorkloadRun  # noqa: E402

__all__ += ["PortBinding", "SshKey", "Template", "Workload", "WorkloadRun"]
from .payouts import Payout  # noqa: E402

__all__ += ["Payout"]
from .alerts import Alert, AlertKind, AlertRule  # noqa: E402

__all__ += ["Alert", "AlertKind", "AlertRule"]
from .operations import AutoscaleAction, AutoscaleRule, ReclaimNotice, ReclaimPolicy  # noqa: E402

__all__ += ["AutoscaleAction", "AutoscaleRule", "ReclaimNotice", "ReclaimPolicy"]
