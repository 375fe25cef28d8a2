"""The agent's Markdown, parsed once (model), cut to a platform's limit (split), and read as plain text (plain)."""
