"""`python -m tfplace.train`: the command line of tfplace.cli.train (flags and help live there)."""

if __name__ == "__main__":
    from tfplace.cli.train import run

    run()
