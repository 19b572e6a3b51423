#!/usr/bin/env bash
# On the device: assemble SGLang 0.5.16's parts (scripts/device/prepare-sglang.sh made them here)
# and install them into their own site dir. SGLang needs transformers 5.12.1 / tokenizers 0.22.2
# (the image's transformers 5.17 already registers qwen3_asr and SGLang's own registration fails
# at start-up), vLLM 0.26.0 runs on the image's 5.17: so SGLang lives in /root/site-sglang and
# vLLM stays in /root/site. Never put both on one PYTHONPATH.
# Usage: bash scripts/device/install-sglang.sh [PARTS_DIR=/root/parts] [TARGET=/root/site-sglang]
#   carry .gpu/sglang-parts/SHA256-sglang with the last part (into PARTS_DIR) to have it checked.
# Then: PYTHONPATH=/root/site-sglang PATH=/root/site-sglang/bin:$PATH python3 -m sglang.launch_server ...
#   (or scripts/device/serve-sglang.sh CONFIG).
set -euo pipefail
parts=${1:-/root/parts}
target=${2:-/root/site-sglang}
whl=/root/whl-sglang
ls "$parts"/s[0-9][0-9] >/dev/null
if [ -f "$parts/SHA256-sglang" ]; then
  got=$(cat "$parts"/s[0-9][0-9] | sha256sum | cut -d' ' -f1)
  [ "$got" = "$(cat "$parts/SHA256-sglang")" ] || { echo "parts sha256 $got != $(cat "$parts/SHA256-sglang")"; exit 1; }
  echo "parts sha256 ok"
fi
rm -rf "$whl" && mkdir -p "$whl"
cat "$parts"/s[0-9][0-9] | tar x -C "$whl"
shopt -s nullglob
wheels=("$whl"/sglang-wheels/*.whl "$whl"/sglang-override/*.whl "$whl"/sglang-extra/*.whl)
echo "installing ${#wheels[@]} wheels into $target"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$target" --upgrade "${wheels[@]}"
python3 - "$target" <<'EOF'
import importlib.metadata as md, sys
target = sys.argv[1]
want = {"sglang": "0.5.16", "transformers": "5.12.1", "tokenizers": "0.22.2", "xgrammar": "0.2.1",
        "flashinfer-python": "0.6.14", "sglang-kernel": None}
have = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in md.distributions(path=[target])}
bad = {k: have.get(k) for k, v in want.items() if k not in have or (v and have[k] != v)}
print({k: have.get(k) for k in want}, f"{len(have)} distributions in {target}")
sys.exit(f"unexpected versions: {bad}" if bad else 0)
EOF
rm -rf "$whl"
echo "SGLang installed: PYTHONPATH=$target PATH=$target/bin:\$PATH (vLLM: PYTHONPATH=/root/site)"
