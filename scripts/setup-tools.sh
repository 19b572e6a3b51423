#!/usr/bin/env bash
# The peer benchmark tools of the tools study (reports/local-cpu-tools, issue 34), each in a venv of
# its own under .cache/tools/: aiperf 0.13.0 would replace pandas 3 with 2.3 and guidellm 0.8.1
# multidict 7 with 6 (aiohttp's) in servelab's .venv, so neither goes into the dev extra.
# Idempotent; uses the same index settings as scripts/setup.sh (scripts/uv_args.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3.11}
mapfile -t uvargs < <(.venv/bin/python scripts/uv_args.py)
for spec in aiperf==0.13.0 guidellm==0.8.1; do
  name=${spec%%==*}
  dir=.cache/tools/$name
  if [ -x "$dir/bin/$name" ] && "$dir/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$name') != '${spec##*==}')"; then
    continue
  fi
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  .venv/bin/uv pip install -q --python "$dir/bin/python" "${uvargs[@]}" "$spec"
  echo "setup-tools: $spec in $dir"
done
