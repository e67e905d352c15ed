#!/usr/bin/env bash
# Sets up everything tfplace needs on a fresh machine:
#   the shared environment: a Python 3.11 virtualenv with the pinned stack (requirements.txt) and
#   Horovod 0.28.1 built from source with Gloo (scripts/build_stack.sh), cached under
#   ${TFPLACE_CACHE:-~/.cache/tfplace} and keyed by a hash of requirements.txt, that script and the
#   Python version, so every checkout on the machine shares it; a new machine (or changed
#   requirements) builds it from scratch (~3–4 minutes on 2 cores);
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

key=$( (cat requirements.txt scripts/build_stack.sh; "$python_bin" -V 2>&1) | sha256sum | cut -c1-16)
cache=${TFPLACE_CACHE:-$HOME/.cache/tfplace}
venv="$cache/venv-$key"
mkdir -p "$cache"

# One build at a time per environment: a second set-up (another checkout, the tests beside the main
# job) waits here for the first, then finds the environment complete. Without the lock both would
# delete and rebuild the same folder under each other.
exec 9>"$venv.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
  log "waiting for another set-up that is building $venv"
  flock 9
fi
if [ ! -f "$venv/.complete" ]; then
  bash scripts/build_stack.sh "$python_bin" "$venv"
fi
# The shared environment holds the stack only: an editable tfplace there (older set-ups put one
# there) would point every checkout at whichever checkout installed it.
if compgen -G "$venv/lib/python*/site-packages/tfplace-*.dist-info" >/dev/null; then
  "$venv/bin/pip" uninstall -y -q --disable-pip-version-check tfplace >&2 || true
fi
exec 9>&-
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
others=()
for d in "$cache"/venv-*; do
  if [ -d "$d" ] && [ "$d" != "$venv" ]; then others+=("$d"); fi
done
if [ "${#others[@]}" -gt 0 ]; then  # nothing removes them: another checkout may still run on one
  log "note: $cache also holds ${#others[@]} environment(s) of other requirements or set-up versions (about 2 GB each);"
  log "      once no checkout of yours runs on them: rm -rf ${others[*]}"
fi

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
