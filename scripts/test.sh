#!/usr/bin/env bash
# Sets up what is missing (scripts/setup_env.sh), then runs every test with pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k simulator`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash scripts/setup_env.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec .venv/bin/python -m pytest "$@"
