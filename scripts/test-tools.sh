#!/usr/bin/env bash
# What the test suite needs beyond the Python stack, from Debian's packages: Chromium renders the run
# report as a person sees it, Prometheus scrapes the running services to check the Grafana dashboard.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "test-tools: installing ${missing[*]} (Debian packages)"
if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "test-tools: run 'sudo apt-get install -y ${missing[*]}'" >&2
    exit 1
fi
