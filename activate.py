"""Deploys strategies and baselines on a cluster: `python activate.py activate_config.txt`."""
from tfplace.cli.activate import run_command

if __name__ == "__main__":
    run_command()
