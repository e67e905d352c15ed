"""`python -m tfplace.pretrain`: the command line of tfplace.cli.pretrain (flags and help live there)."""

if __name__ == "__main__":
    from tfplace.cli.pretrain import run

    run()
