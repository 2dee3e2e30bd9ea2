"""Accounts: sign-up with e-mail confirmation, log-in lock-out and per-address throttles, the optional second
factor (TOTP) and the provider role (docs/accounts.md). One package of the products layer: its modules share
the pure rules (`policy`), the throttle (`throttle`) and the mail (`mail`)."""
