#!/usr/bin/env bash
# docs/config.md is the current schema (regenerate with scripts/gen-config-doc.sh).
#   tests/docs.sh build/ctitan
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if bash "$ROOT/scripts/gen-config-doc.sh" "$1" | cmp -s - "$ROOT/docs/config.md"; then
  echo "1 passed, 0 failed"
else
  echo "docs/config.md is stale: run scripts/gen-config-doc.sh build/ctitan > docs/config.md"
  echo "0 passed, 1 failed"
  exit 1
fi
