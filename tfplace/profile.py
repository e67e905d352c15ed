"""`python -m tfplace.profile`: the command line of tfplace.cli.profile (flags and help live there)."""

if __name__ == "__main__":
    from tfplace.cli.profile import run

    run()
