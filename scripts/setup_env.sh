#!/usr/bin/env bash
# Sets up everything tfplace needs on a fresh machine:
#   a Python 3.11 virtualenv with the pinned stack (requirements.txt) and Horovod 0.28.1 built
#   from source with Gloo against that TensorFlow, cached under ${TFPLACE_CACHE:-~/.cache/tfplace}
#   and keyed by a hash of requirements.txt and this script, so every checkout on the machine
#   shares it; a new machine (or changed requirements) builds it from scratch (~3–4 minutes on
#   2 cores);
#   ./.venv, this checkout's own small virtualenv: it sees the cached packages (a .pth file) and
#   holds this checkout's editable install of tfplace. Two checkouts never run each other's code,
#   whichever of them ran this script last.
# Safe to run again: it only installs what is missing.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
log() { printf '[setup] %s\n' "$*" >&2; }

python_bin=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 && \
     "$candidate" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] < (3, 12) else 1)'; then
    python_bin=$(command -v "$candidate"); break
  fi
done
if [ -z "$python_bin" ]; then
  log "error: tfplace needs Python 3.9–3.11 (TensorFlow 2.15 has no wheels for newer Pythons)."
  log "fix: install python3.11 (e.g. 'apt-get install python3.11 python3.11-venv') and run again."
  exit 1
fi
for tool in g++ make cmake; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "installing build tools for Horovod (g++, make, cmake)"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq g++ make cmake >/dev/null;
    else log "error: $tool is missing; fix: install g++, make and cmake"; exit 1; fi
    break
  fi
done

key=$( (cat requirements.txt scripts/setup_env.sh; "$python_bin" -V 2>&1) | sha256sum | cut -c1-16)
cache=${TFPLACE_CACHE:-$HOME/.cache/tfplace}
venv="$cache/venv-$key"
mkdir -p "$cache"

if [ ! -f "$venv/.complete" ]; then
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
fi

# The shared environment holds the stack only: an editable tfplace there (older set-ups put one
# there) would point every checkout at whichever checkout installed it.
if compgen -G "$venv/lib/python*/site-packages/tfplace-*.dist-info" >/dev/null; then
  "$venv/bin/pip" uninstall -y -q --disable-pip-version-check tfplace >&2 || true
fi
overlay="$repo/.venv"
marker="$overlay/.tfplace-stack"  # the shared environment this overlay reads
[ -L "$overlay" ] && rm -f "$overlay"  # older set-ups linked the shared environment here
if [ -e "$overlay" ] && [ ! -f "$marker" ]; then
  log "error: $overlay exists and was not made by scripts/setup_env.sh"
  log "fix: move it away (e.g. 'mv .venv .venv.old') and run again"
  exit 2
fi
if [ ! -x "$overlay/bin/python" ] || [ "$(cat "$marker" 2>/dev/null)" != "$venv" ]; then
  rm -rf "$overlay"
  "$python_bin" -m venv --without-pip "$overlay"
  echo "$venv" > "$marker"
fi
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
stack_site=$("$venv/bin/python" -c "$purelib")
overlay_site=$("$overlay/bin/python" -c "$purelib")
printf 'import site; site.addsitedir(%s)\n' "'$stack_site'" > "$overlay_site/00-tfplace-stack.pth"
"$overlay/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 \
  | grep -v "is ignored" >&2 || true
"$overlay/bin/python" -c "import tfplace, sys; sys.exit(0 if tfplace.__file__.startswith('$repo/') else 1)" || {
  log "error: .venv does not import this checkout's tfplace; see the pip output above"; exit 1; }
log "ready: .venv (this checkout) on $venv (shared)"

# The Grappler plugin (tfplace.rewrite.grappler): C++ built against this TensorFlow's headers into
# $cache/grappler/<TF, Python, source key>/ (~5 s). Optional: without it only the plugin is missing
# (its tests skip with the reason), so a failed build does not fail the set-up.
if plugin=$(TF_CPP_MIN_LOG_LEVEL=3 TFPLACE_CACHE="$cache" .venv/bin/python -c \
    "from tfplace.rewrite.grappler import build_plugin; print(build_plugin())" 2>/tmp/tfplace-plugin-build.$$); then
  log "Grappler plugin: $plugin"
else
  log "warning: the Grappler plugin was not built (tfplace.rewrite.grappler); continuing without it:"
  grep -v "^20[0-9][0-9]-" /tmp/tfplace-plugin-build.$$ | tail -n 12 >&2 || true
fi
rm -f /tmp/tfplace-plugin-build.$$
