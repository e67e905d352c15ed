"""`python -m tfplace.plan`: the command line of tfplace.cli.plan (flags and help live there)."""

if __name__ == "__main__":
    from tfplace.cli.plan import run

    run()
