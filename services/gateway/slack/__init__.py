"""Slack's gateway: one app per instance, over Socket Mode or the Events API (`python -m services.gateway.slack`)."""
