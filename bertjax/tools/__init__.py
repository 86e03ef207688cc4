"""Command-line tools: `python -m bertjax.tools.<name> --help`."""
