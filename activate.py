"""Deploys strategies and baselines on a cluster: `python activate.py activate_config.txt`."""
import sys

from tfplace.cli.activate import main

if __name__ == "__main__":
    sys.exit(main())
