"""The `starling` command line: one module per verb group, each registering its verbs on the parser."""
