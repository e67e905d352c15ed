#!/usr/bin/env bash
# Builds the shared environment scripts/setup_env.sh caches: a virtualenv at $2 made with the
# Python $1, holding the pinned stack (requirements.txt) and Horovod 0.28.1 built from source with
# Gloo against that TensorFlow. The cache key hashes requirements.txt, this file and the Python
# version, so changes to the rest of the set-up never rebuild it. Marks it complete last.
#   bash scripts/build_stack.sh PYTHON VENV
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[setup] %s\n' "$*" >&2; }
python_bin=$1
venv=$2
start=$(date +%s)
rm -rf "$venv"
log "creating virtualenv $venv"
"$python_bin" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -U pip setuptools wheel 2>&1 | grep -v "is ignored" >&2 || true
log "installing the pinned stack (requirements.txt)"
"$venv/bin/pip" install -q --disable-pip-version-check -r requirements.txt 2>&1 | grep -v "is ignored" >&2 || true
"$venv/bin/python" -c "import tensorflow, tf_agents, graph_nets, sonnet" >/dev/null 2>&1 || {
  log "error: the pinned stack did not install; see the pip output above"; exit 1; }
log "building Horovod 0.28.1 with Gloo against this TensorFlow (about 2–3 minutes)"
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS="-j$(nproc)" \
  "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-build-isolation \
  horovod==0.28.1 2>&1 | grep -v "is ignored" >&2 || true
# read the whole report first: `| grep -q` may exit before horovodrun has written it all, and
# the SIGPIPE that horovodrun then gets fails the pipe under pipefail
build_report=$("$venv/bin/horovodrun" --check-build 2>/dev/null || true)
grep -q "\[X\] Gloo" <<<"$build_report" || {
  log "error: Horovod did not build with Gloo; see the pip output above"; exit 1; }
touch "$venv/.complete"
log "environment built in $(( $(date +%s) - start )) s"
