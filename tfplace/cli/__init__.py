"""Command-line entry points. Each is thin: flags, validation, then the library. Nothing imports
this package but the `python -m tfplace.X` shims; its `common` module (the one command-line
contract: absl flags, error lines, output-path checks) is shared by every binary, the zoo
exporter's included. It may import everything."""
