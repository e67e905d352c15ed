"""Command-line entry points. Each is thin: flags, validation, then the library. Nothing imports
this package; it may import everything."""
