"""`python -m tfplace.simulate`: the command line of tfplace.cli.simulate (flags and help live there)."""

if __name__ == "__main__":
    from tfplace.cli.simulate import run

    run()
