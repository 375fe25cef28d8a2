"""The agent's tools. registry.py runs them by name; one module per group: files, shell, jobs, memory,
recall, send, cron, web (web_net.py: the addresses and redirects web_fetch may reach), skills; mcp.py the
MCP servers' tools. confine.py confines file paths; classify.py (with shell_lex.py, shell_paths.py and
shell_options.py) gives shell commands their approval class; output.py bounds results; search.py is
file_search's worker.

Kept free of imports, so that search.py can run as a bare script (python -I -S) from this folder.
"""
