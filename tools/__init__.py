"""The ooc command-line tools."""
