"""`python -m tfplace.compare`: the command line of tfplace.cli.compare (flags and help live there)."""

if __name__ == "__main__":
    from tfplace.cli.compare import run

    run()
