"""WhatsApp's gateway: one number per instance, on the Cloud API or as a linked device."""
