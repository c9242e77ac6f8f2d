#!/usr/bin/env bash
# The system programs the campaign and the tests use that no pinned Python or npm package ships:
# Prometheus (the local campaign scrapes the engines' histograms with it) and Chromium (the browser
# tests render report.html in it). Each is installed from the OS's packages only when missing:
# directly as root, through `sudo -n` where that is allowed without a password; otherwise nothing
# runs and one line names the command to run once. Idempotent: a second run installs nothing.
#
#   tools/system-deps.sh prometheus chromium
#
# Each argument is a program that must be on PATH; on Debian and Ubuntu its package has the same
# name (prometheus 2.42 on Debian 12, chromium 156: the versions the tests ran with).
set -euo pipefail

missing=()
for program in "$@"; do
  command -v "$program" >/dev/null 2>&1 || missing+=("$program")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

# With the packages' recommends, as CI has always installed them: chromium-common recommends the
# fonts (fonts-liberation) and the Mesa drivers its headless rendering uses.
install=(apt-get install -y -qq "${missing[@]}")
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing: ${missing[*]}. This machine has no apt-get (the README's platform is Debian or Ubuntu):" >&2
  echo "install ${missing[*]} with its package manager so that each is on PATH, then run make again." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "missing: ${missing[*]}, and installing needs root. Run once: sudo apt-get update && sudo ${install[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} (apt-get) ..."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 ||
  ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive "${install[@]}" >>"$log" 2>&1; then
  cat "$log" >&2
  echo "apt-get could not install ${missing[*]}: see above; then run make again." >&2
  exit 1
fi
for program in "${missing[@]}"; do
  command -v "$program" >/dev/null 2>&1 || { echo "$program is still not on PATH after apt-get install" >&2; exit 1; }
done
