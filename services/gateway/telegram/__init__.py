"""Telegram's gateway: one bot per instance, over the Bot API (`python -m services.gateway.telegram`)."""
